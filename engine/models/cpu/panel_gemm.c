/* y = x @ W^T (+ bias) in fp32 for x [m, k] (contiguous) and a weight W [n, k] packed once into column panels:
 * one of the candidate kernels for the text stack's products on CPU (engine/models/cpu/panel_gemm.py says why, and
 * engine/models/cpu/linear.py when it is used). Needs AVX2 and FMA; one thread.
 *
 * Layout: W is cut into panels of NR output columns; panel p holds W[p*NR + j][kk] at [(p*k + kk)*NR + j] (zero
 * past n), so a tile reads its weights as one forward stream and nothing is re-packed per call. A tile is MR rows
 * x NR columns held in 12 AVX registers (4 rows x 3 registers) while k runs through a block of KC; the block's
 * partial sums are then added to y, so each output is a sum of per-block sums in k order (as blocked BLAS kernels
 * do; a single running sum over all k would round worse). The summation order does not depend on m or on a row's
 * position: a row's result is the same whatever rows it is computed with. */
#include <immintrin.h>
#include <stdint.h>

#define NR 24   /* output columns per panel: 3 registers of 8 floats */
#define MR 4    /* rows per tile: 12 accumulators + 3 weight registers + 1 broadcast = the 16 AVX registers */
#define KC 256  /* k per block: a panel block is 24 KB, kept in L1 while the row tiles pass over it */

static inline void add_row(float *y, __m256 a, __m256 b, __m256 c, int64_t ncols, int first, const float *bias) {
    if (ncols == NR) {  /* a full panel: vector adds, in the order the scalar path below uses */
        if (!first) {
            a = _mm256_add_ps(_mm256_loadu_ps(y), a);
            b = _mm256_add_ps(_mm256_loadu_ps(y + 8), b);
            c = _mm256_add_ps(_mm256_loadu_ps(y + 16), c);
        }
        if (bias) {
            a = _mm256_add_ps(a, _mm256_loadu_ps(bias));
            b = _mm256_add_ps(b, _mm256_loadu_ps(bias + 8));
            c = _mm256_add_ps(c, _mm256_loadu_ps(bias + 16));
        }
        _mm256_storeu_ps(y, a);
        _mm256_storeu_ps(y + 8, b);
        _mm256_storeu_ps(y + 16, c);
        return;
    }
    float sum[NR];
    _mm256_storeu_ps(sum, a);
    _mm256_storeu_ps(sum + 8, b);
    _mm256_storeu_ps(sum + 16, c);
    for (int64_t j = 0; j < ncols; j++) {
        float v = first ? sum[j] : y[j] + sum[j];
        y[j] = bias ? v + bias[j] : v;
    }
}

#define ZERO(i) __m256 c##i##0 = _mm256_setzero_ps(), c##i##1 = _mm256_setzero_ps(), c##i##2 = _mm256_setzero_ps();
#define FMA(i) if (rows > i) { \
        __m256 xb = _mm256_broadcast_ss(x + i * ldx + kk); \
        c##i##0 = _mm256_fmadd_ps(xb, w0, c##i##0); \
        c##i##1 = _mm256_fmadd_ps(xb, w1, c##i##1); \
        c##i##2 = _mm256_fmadd_ps(xb, w2, c##i##2); }
#define STORE(i) if (rows > i) add_row(y + i * ldy, c##i##0, c##i##1, c##i##2, ncols, first, bias);

/* One tile of ROWS rows over k in [k0, k1): x and panel point at k = 0; prefetch: pull the next panel's same
 * block towards L1 while this one computes (few rows: too little work per weight byte to hide memory latency). */
#define TILE(ROWS) \
static void tile##ROWS(const float *x, int64_t ldx, const float *panel, int64_t k, int64_t k0, int64_t k1, \
                       float *y, int64_t ldy, int64_t ncols, int first, const float *bias, int prefetch) { \
    const int rows = ROWS; \
    ZERO(0) ZERO(1) ZERO(2) ZERO(3) \
    for (int64_t kk = k0; kk < k1; kk++) { \
        const float *w = panel + kk * NR; \
        if (prefetch) { \
            _mm_prefetch((const char *)(w + k * NR), _MM_HINT_T0); \
            _mm_prefetch((const char *)(w + k * NR + 16), _MM_HINT_T0); \
        } \
        __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8), w2 = _mm256_loadu_ps(w + 16); \
        FMA(0) FMA(1) FMA(2) FMA(3) \
    } \
    STORE(0) STORE(1) STORE(2) STORE(3) \
}
TILE(1) TILE(2) TILE(3) TILE(4)

int64_t owlet_panel_floats(int64_t n, int64_t k) { return (n + NR - 1) / NR * NR * k; }

void owlet_panel_pack(const float *w, int64_t n, int64_t k, float *packed) {
    for (int64_t p = 0; p * NR < n; p++)
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t j = 0; j < NR; j++) {
                int64_t col = p * NR + j;
                packed[(p * k + kk) * NR + j] = col < n ? w[col * k + kk] : 0.0f;
            }
}

/* Few rows do too little work per weight byte for the hardware prefetcher to keep up (a 16-row product over the
 * bench model's matrices ran 1.2x faster with the software prefetch); many rows are compute bound, and there the
 * extra loads cost (128-256 rows: 5-15 % slower with it). */
#define PREFETCH_MAX_ROWS 32

int64_t owlet_panel_count(int64_t n) { return (n + NR - 1) / NR; }

/* Panels [p0, p1) of the product (their columns of y); threads split a product by panels. */
void owlet_panel_gemm(const float *x, int64_t m, int64_t k, const float *packed, int64_t n, const float *bias,
                      float *y, int64_t p0, int64_t p1) {
    int prefetch = m <= PREFETCH_MAX_ROWS;
    for (int64_t p = p0; p < p1 && p * NR < n; p++) {
        const float *panel = packed + p * k * NR;
        int64_t col = p * NR, ncols = n - col < NR ? n - col : NR;
        int pf = prefetch && p + 1 < p1 && (p + 1) * NR < n;
        for (int64_t k0 = 0; k0 < k; k0 += KC) {
            int64_t k1 = k0 + KC < k ? k0 + KC : k;
            int first = k0 == 0;
            const float *b = k1 == k && bias ? bias + col : 0;
            int64_t r = 0;
            for (; r + MR <= m; r += MR)
                tile4(x + r * k, k, panel, k, k0, k1, y + r * n + col, n, ncols, first, b, pf);
            switch (m - r) {
                case 3: tile3(x + r * k, k, panel, k, k0, k1, y + r * n + col, n, ncols, first, b, pf); break;
                case 2: tile2(x + r * k, k, panel, k, k0, k1, y + r * n + col, n, ncols, first, b, pf); break;
                case 1: tile1(x + r * k, k, panel, k, k0, k1, y + r * n + col, n, ncols, first, b, pf); break;
            }
        }
    }
}
