/* The keyed streams' raw words made with the CPU's AES instructions: noise.stream.
 *
 * keystream(key, first, out, mode) writes (mode 0), adds (mode 1) or
 * subtracts (mode 2, all modulo 2^64) words first ... first + len(out) - 1
 * of the AES-128 counter-mode stream of the 32-byte stream key into the
 * uint64 buffer out. The stream is the one noise/stream.py describes: block
 * b is AES-128_K(c + b mod 2^128) with K = key[0:16] and c the little-endian
 * integer key[16:32], the 16-byte block giving two little-endian words. The
 * words go straight from the cipher's registers into out, so no counter
 * blocks are built in memory and adding a stream into a vector is one pass
 * over it; no interpreter state is touched meanwhile, so the lock is
 * released for the pass.
 *
 * The cipher is the AES-NI instruction sequence of Gueron, "Intel Advanced
 * Encryption Standard (AES) New Instructions Set", Intel white paper 323641
 * (2010): the AES-128 key schedule by AESKEYGENASSIST, ten rounds of
 * AESENC/AESENCLAST, eight counter blocks in flight. The instructions take
 * the same time whatever the key and data. Where the CPU lacks them (or the
 * build is not for x86-64 with GCC or clang) AES_NI is False and
 * noise.stream makes the same words with OpenSSL; tests compare the two word
 * for word, and with AES-128 known answers (FIPS-197 appendix C.1).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define KEY_BYTES 32
#define MODE_STORE 0
#define MODE_ADD 1
#define MODE_SUBTRACT 2

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define HAVE_AES_NI 1
#include <emmintrin.h>
#include <wmmintrin.h>

#define AES_TARGET __attribute__((target("aes,sse2")))
#define IN_FLIGHT 8

AES_TARGET static inline __m128i expand_step(__m128i key, __m128i assist)
{
    assist = _mm_shuffle_epi32(assist, 0xff);
    key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
    key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
    key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
    return _mm_xor_si128(key, assist);
}

#define EXPAND(k, rcon) expand_step((k), _mm_aeskeygenassist_si128((k), (rcon)))

AES_TARGET static void key_schedule(const uint8_t *key, __m128i rk[11])
{
    rk[0] = _mm_loadu_si128((const __m128i *)key);
    rk[1] = EXPAND(rk[0], 0x01);
    rk[2] = EXPAND(rk[1], 0x02);
    rk[3] = EXPAND(rk[2], 0x04);
    rk[4] = EXPAND(rk[3], 0x08);
    rk[5] = EXPAND(rk[4], 0x10);
    rk[6] = EXPAND(rk[5], 0x20);
    rk[7] = EXPAND(rk[6], 0x40);
    rk[8] = EXPAND(rk[7], 0x80);
    rk[9] = EXPAND(rk[8], 0x1b);
    rk[10] = EXPAND(rk[9], 0x36);
}

AES_TARGET static inline void combine(uint64_t *at, __m128i block, int mode)
{
    __m128i *p = (__m128i *)at;
    if (mode == MODE_STORE) {
        _mm_storeu_si128(p, block);
    } else if (mode == MODE_ADD) {
        _mm_storeu_si128(p, _mm_add_epi64(_mm_loadu_si128(p), block));
    } else {
        _mm_storeu_si128(p, _mm_sub_epi64(_mm_loadu_si128(p), block));
    }
}

/* Blocks first_block ... first_block + blocks - 1 combined into out (2 words each). */
AES_TARGET static void run_blocks(const __m128i rk[11], uint64_t low, uint64_t high,
                                  uint64_t first_block, uint64_t *out, size_t blocks, int mode)
{
    uint64_t lo = low + first_block;
    uint64_t hi = high + (lo < low); /* the counter is c + b modulo 2^128 */
    size_t b = 0;
    for (; b + IN_FLIGHT <= blocks; b += IN_FLIGHT) {
        __m128i x[IN_FLIGHT];
        for (int j = 0; j < IN_FLIGHT; j++) {
            x[j] = _mm_xor_si128(_mm_set_epi64x((long long)hi, (long long)lo), rk[0]);
            lo++;
            hi += (lo == 0);
        }
        for (int r = 1; r < 10; r++) {
            for (int j = 0; j < IN_FLIGHT; j++) {
                x[j] = _mm_aesenc_si128(x[j], rk[r]);
            }
        }
        for (int j = 0; j < IN_FLIGHT; j++) {
            combine(out + 2 * (b + j), _mm_aesenclast_si128(x[j], rk[10]), mode);
        }
    }
    for (; b < blocks; b++) {
        __m128i x = _mm_xor_si128(_mm_set_epi64x((long long)hi, (long long)lo), rk[0]);
        lo++;
        hi += (lo == 0);
        for (int r = 1; r < 10; r++) {
            x = _mm_aesenc_si128(x, rk[r]);
        }
        combine(out + 2 * b, _mm_aesenclast_si128(x, rk[10]), mode);
    }
}

static inline uint64_t combined(uint64_t target, uint64_t word, int mode)
{
    if (mode == MODE_STORE) {
        return word;
    }
    return mode == MODE_ADD ? target + word : target - word;
}

static uint64_t load_le64(const uint8_t *bytes)
{
    uint64_t value = 0;
    for (int i = 7; i >= 0; i--) {
        value = (value << 8) | bytes[i];
    }
    return value;
}

AES_TARGET static void stream_words(const uint8_t *key, uint64_t first, uint64_t *out,
                                    size_t count, int mode)
{
    __m128i rk[11];
    uint64_t spare[2];
    const uint64_t low = load_le64(key + 16), high = load_le64(key + 24);
    key_schedule(key, rk);
    size_t done = 0;
    if (count && (first & 1)) { /* a first word at an odd place: the second half of a block */
        run_blocks(rk, low, high, first >> 1, spare, 1, MODE_STORE);
        out[0] = combined(out[0], spare[1], mode);
        done = 1;
    }
    const size_t whole = (count - done) / 2;
    run_blocks(rk, low, high, (first + done) >> 1, out + done, whole, mode);
    done += 2 * whole;
    if (done < count) { /* a last word alone: the first half of its block */
        run_blocks(rk, low, high, (first + done) >> 1, spare, 1, MODE_STORE);
        out[done] = combined(out[done], spare[0], mode);
    }
    /* Best effort: the round keys and the words held aside are cleared here;
     * copies the compiler keeps in registers or spills elsewhere on the stack
     * are not (the stream key itself lives on in the caller's bytes). */
    volatile uint8_t *wipe = (volatile uint8_t *)rk;
    for (size_t i = 0; i < sizeof(rk); i++) {
        wipe[i] = 0;
    }
    wipe = (volatile uint8_t *)spare;
    for (size_t i = 0; i < sizeof(spare); i++) {
        wipe[i] = 0;
    }
}

static int cpu_has_aes(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("aes") && __builtin_cpu_supports("sse2");
}
#else
#define cpu_has_aes() 0
#define HAVE_AES_NI 0
#endif

/* Whether this CPU has the instructions: asked once, when the module is imported. */
static int aes_available = 0;

static PyObject *keystream(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer key, out;
    PyObject *place;
    int mode;
    if (!PyArg_ParseTuple(args, "y*Ow*i", &key, &place, &out, &mode)) {
        return NULL;
    }
    PyObject *result = NULL;
    /* Any integer (numpy's too); a negative or too large one is an OverflowError,
     * not a wrapped one. */
    unsigned long long first = 0;
    PyObject *index = PyNumber_Index(place);
    if (index != NULL) {
        first = PyLong_AsUnsignedLongLong(index);
        Py_DECREF(index);
    }
    if (PyErr_Occurred()) {
        PyBuffer_Release(&key);
        PyBuffer_Release(&out);
        return NULL;
    }
#if HAVE_AES_NI
    if (!aes_available) {
        PyErr_SetString(PyExc_RuntimeError, "this CPU has no AES instructions (AES_NI is False)");
    } else if (key.len != KEY_BYTES) {
        PyErr_Format(PyExc_ValueError, "the stream key must be %d bytes; got %zd", KEY_BYTES,
                     key.len);
    } else if (mode < MODE_STORE || mode > MODE_SUBTRACT) {
        PyErr_Format(PyExc_ValueError, "mode must be 0 (store), 1 (add) or 2 (subtract); got %d",
                     mode);
    } else if (out.len % 8 != 0 || ((uintptr_t)out.buf) % 8 != 0) {
        PyErr_Format(PyExc_ValueError,
                     "out must be an 8-byte aligned buffer of whole uint64 words; got %zd bytes",
                     out.len);
    } else if (out.len > 0 && first > UINT64_MAX - (uint64_t)(out.len / 8) + 1) {
        PyErr_SetString(PyExc_ValueError, "first + len(out) passes the end of a 2^64-word stream");
    } else {
        const size_t count = (size_t)(out.len / 8);
        Py_BEGIN_ALLOW_THREADS
        stream_words((const uint8_t *)key.buf, (uint64_t)first, (uint64_t *)out.buf, count, mode);
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        result = Py_None;
    }
#else
    (void)first;
    (void)mode;
    PyErr_SetString(PyExc_RuntimeError, "built without AES instructions (AES_NI is False)");
#endif
    PyBuffer_Release(&key);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"keystream", keystream, METH_VARARGS,
     "keystream(key, first, out, mode): words first.. of the stream of key, stored (0), added "
     "(1) or subtracted (2) into out."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_keystream",
    "The keyed streams' raw words made with the CPU's AES instructions.", -1, methods,
};

PyMODINIT_FUNC PyInit__keystream(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    aes_available = cpu_has_aes();
    if (PyModule_AddObject(m, "AES_NI", PyBool_FromLong(aes_available)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
