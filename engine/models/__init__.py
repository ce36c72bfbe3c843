"""The model side of the engine: where a checkpoint lies and its served name (``checkpoint_folder``), the rules of its
generation config (``generation_defaults``), the verified families and what each needs (``families``), the runner
interface the loop calls (``runner_interface``), the generic transformers runner (``model_runner``) and how a
family's runner is made (``runners``), mPLUG-Owl3's native runner (``mplug_owl3``), the CPU matmul kernels
(``cpu``), the transformers versions accepted (``transformers_version``) and the reference run tests compare against
(``reference_run``)."""
