#!lua flags=allow-oom
-- FINISH: queued | dispatched | started -> done | error | cancelled, with the terminal event, atomically.
-- args: job; type: the state it ends in (also its last event's type); data: that event's JSON
--   answer: the answer's turn as JSON, appended to the conversation when it is done ('' = none); answer_chars: its
--   text's characters, for the conversation's sum the history limits read (budgets.lua turn_measure)
--   holder: the worker that now holds the conversation's cache ('' = none), for holder_ttl_s seconds
--   only_state, only_worker: end it only while it is in this state / owned by this worker ('' = any): a runner
--   ends only the job it still owns
--   stream_ttl_s, stream_maxlen
--   service_s: the job's run time on its worker, folded into the moving average queue ETAs rest on when the job ends
--   here (nil = none)
--   tail: a token event's data (JSON), written just before the terminal event when the job ends here: the answer's
--   last tokens, which its worker sends with the finish rather than in a round trip of their own (nil = none)
--   take_worker (optional): once the job has ended, take the next job for this worker in the slot it freed, in the
--   same atomic step (POP's `worker`; with take_capacity, take_shared, take_light_from and now), so no dispatch pass
--   can hand that slot to Celery in between
-- Returns 1 when it ended the job (with take_worker and a job taken: 1 followed by POP's reply); 0 when the job had
-- ended already, or is not in only_state / only_worker's.
local ended = finish(args.job, args.type, args.data, args.answer, args.stream_ttl_s, args.stream_maxlen, args.holder,
                     args.holder_ttl_s, args.only_state ~= '' and args.only_state or nil,
                     args.only_worker ~= '' and args.only_worker or nil, args.tail, args.answer_chars)
if ended == 1 and args.service_s then fold_service_time(args.service_s) end
local taken = ended == 1 and args.take_worker and
  pop_next(args.take_capacity, args.take_shared, args.take_light_from, args.now, args.take_worker, args.stream_maxlen)
write_service_time()  -- (unless the take wrote it with the slot layout)
if taken then return {1, unpack(taken)} end
return ended
