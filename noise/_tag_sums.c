/* The aggregate check's tags in one pass over the words: noise.aggregate_check.tags.
 *
 * tag_sums(words, rho, out) adds, for each of the four challenge vectors
 * rho^(l) (the 16-bit quarters of the packed words of rho), the exact integer
 * <rho^(l), signed(words)> into out[l] (a signed 128-bit integer, stored as
 * its low and high 64-bit halves: out is 8 little-endian uint64 words).
 *
 * Exactness. A word w is lo + 2^32 hi - 2^64 s, with lo and hi its unsigned
 * 32-bit halves and s its top bit (signed(w) = w - 2^64 [w >= 2^63]). For a
 * quarter r < 2^16 each product r lo and r hi is below 2^48, so 2^16 of them
 * add up in an unsigned 64-bit lane without wrapping; a block of BLOCK
 * entries is therefore summed in 64-bit lanes (which vectorise), and the
 * block's sums are moved into 128-bit totals:
 * total += sum(r lo) + 2^32 sum(r hi) - 2^64 sum(r s). The result is
 * below d 2^80 in magnitude, inside a signed 128-bit integer for d < 2^47
 * (the check refuses longer vectors).
 *
 * No interpreter state is touched while the words are read, so the lock is
 * released for the pass.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define QUARTERS 4
#define BLOCK (1 << 16)

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
/* One build for every x86-64 machine, the wider vectors where the CPU has them. */
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

CLONES
static void block_sums(const uint64_t *restrict words, const uint64_t *restrict rho, size_t n,
                       uint64_t *restrict low, uint64_t *restrict high, uint64_t *restrict sign)
{
    uint64_t l0 = 0, l1 = 0, l2 = 0, l3 = 0;
    uint64_t h0 = 0, h1 = 0, h2 = 0, h3 = 0;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < n; i++) {
        const uint64_t w = words[i], r = rho[i];
        const uint64_t lo = w & 0xffffffffu, hi = w >> 32, top = 0 - (w >> 63);
        const uint64_t r0 = r & 0xffffu, r1 = (r >> 16) & 0xffffu;
        const uint64_t r2 = (r >> 32) & 0xffffu, r3 = r >> 48;
        l0 += r0 * lo;
        l1 += r1 * lo;
        l2 += r2 * lo;
        l3 += r3 * lo;
        h0 += r0 * hi;
        h1 += r1 * hi;
        h2 += r2 * hi;
        h3 += r3 * hi;
        s0 += r0 & top;
        s1 += r1 & top;
        s2 += r2 & top;
        s3 += r3 & top;
    }
    low[0] = l0, low[1] = l1, low[2] = l2, low[3] = l3;
    high[0] = h0, high[1] = h1, high[2] = h2, high[3] = h3;
    sign[0] = s0, sign[1] = s1, sign[2] = s2, sign[3] = s3;
}

static void add_tags(const uint64_t *words, const uint64_t *rho, size_t n, __int128 *totals)
{
    uint64_t low[QUARTERS], high[QUARTERS], sign[QUARTERS];
    for (size_t start = 0; start < n; start += BLOCK) {
        const size_t entries = n - start < BLOCK ? n - start : BLOCK;
        block_sums(words + start, rho + start, entries, low, high, sign);
        for (int q = 0; q < QUARTERS; q++) {
            totals[q] += (__int128)low[q] + ((__int128)high[q] << 32) - ((__int128)sign[q] << 64);
        }
    }
}

static PyObject *tag_sums(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer words, rho, out;
    if (!PyArg_ParseTuple(args, "y*y*w*", &words, &rho, &out)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (words.len % 8 != 0 || words.len != rho.len) {
        PyErr_Format(PyExc_ValueError,
                     "tag_sums needs two buffers of whole uint64 words of one length; got %zd "
                     "and %zd bytes",
                     words.len, rho.len);
        goto done;
    }
    if (out.len != 2 * QUARTERS * 8) {
        PyErr_Format(PyExc_ValueError, "tag_sums writes %d uint64 words; got %zd bytes",
                     2 * QUARTERS, out.len);
        goto done;
    }
    if (((uintptr_t)words.buf | (uintptr_t)rho.buf | (uintptr_t)out.buf) % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "tag_sums needs buffers aligned to 8 bytes");
        goto done;
    }
    __int128 totals[QUARTERS];
    uint64_t *halves = out.buf;
    for (int q = 0; q < QUARTERS; q++) {
        totals[q] = (__int128)(((unsigned __int128)halves[2 * q + 1] << 64) | halves[2 * q]);
    }
    Py_BEGIN_ALLOW_THREADS
    add_tags(words.buf, rho.buf, (size_t)words.len / 8, totals);
    Py_END_ALLOW_THREADS
    for (int q = 0; q < QUARTERS; q++) {
        const unsigned __int128 bits = (unsigned __int128)totals[q];
        halves[2 * q] = (uint64_t)bits;
        halves[2 * q + 1] = (uint64_t)(bits >> 64);
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&words);
    PyBuffer_Release(&rho);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"tag_sums", tag_sums, METH_VARARGS,
     "tag_sums(words, rho, out): add <rho^(l), signed(words)> into out[l] for the four "
     "16-bit quarters l of the packed challenge rho; out holds four signed 128-bit totals as "
     "(low, high) uint64 pairs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tag_sums",
    "The aggregate check's tags in one pass over the words (noise.aggregate_check.tags).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__tag_sums(void) { return PyModule_Create(&module); }
