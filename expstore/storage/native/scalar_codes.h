/* expstore.storage.native._kernels: shards' scalar values coded into their hot-set slots in
 * one call (``scalar_codes.py`` holds the numpy version this replaces where it is built;
 * tests compare the two). Included once, by ``_kernels.c``, after ``batch_lookup.h``.
 *
 *   code_rows(src, starts, counts, kind, itemsize, bits, low, table, size, dst,
 *             dst_starts, slot_bytes) -> (done, size)
 *       shard k's ``counts[k]`` values (``itemsize`` bytes each, of numpy kind ``kind``:
 *       'b', 'i', 'u' or 'f') at byte ``starts[k]`` of ``src``, each as its code in
 *       ``bits`` bits (1, 2, 4 or 8; low bits first in each byte) at byte
 *       ``dst_starts[k]`` of ``dst``, the rest of its ``slot_bytes`` zeroed. ``low``: an
 *       int, the fixed book's first value (code = value - low; a bool's code is its
 *       value), or ``None``: the learned book ``table`` (``2 ** bits`` entries of
 *       ``itemsize`` bytes, the first ``size`` in use), keyed by a value's bytes, to which
 *       values not yet in it are appended. Stops at the first shard whose values the book
 *       cannot hold (a code out of range; no room left): ``done`` is the shards coded
 *       before it and ``size`` the book's entries in use after them (entries the failed
 *       shard wrote past it are unused). Runs without the GIL: a gather reading the book
 *       only reads entries below the size it was given.
 *
 * At 100M rows the first seconds after open code every shard of every coded field once
 * (24,448 shard-fields for the section's store): numpy's seven passes over each shard
 * took ~85 us of it, its read and decode ~160 (under cProfile).
 */

/* a value's bytes as an unsigned key (zero-extended) */
static inline uint64_t value_key(const uint8_t *p, size_t itemsize) {
    switch (itemsize) {
    case 1: return p[0];
    case 2: { uint16_t v; memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; memcpy(&v, p, 4); return v; }
    default: { uint64_t v; memcpy(&v, p, 8); return v; }
    }
}

/* learned books: an open-addressing map of (key -> code) over the book's entries */
#define BOOK_MAP 1024 /* slots: at least twice the largest book (256 codes) */

typedef struct {
    uint64_t key[BOOK_MAP];
    int16_t code[BOOK_MAP]; /* -1: empty */
} book_map;

static int book_find(const book_map *m, uint64_t key, size_t *at) {
    size_t h = (size_t)mix64(key) & (BOOK_MAP - 1);
    while (m->code[h] >= 0 && m->key[h] != key) h = (h + 1) & (BOOK_MAP - 1);
    *at = h;
    return m->code[h];
}

/* Codes of `m` values at `v` in a fixed book (value - low, each below n_codes) into
   `c`: 1, or 0 at a value outside the book. One loop per type, so each is a tight one
   (a shard is coded once, but at 100M rows that is 400M values). A value of a type an
   int64 holds is compared with `low` as an int64, and then value - low, taken as a
   uint64, is exact: no wrap-around can bring a value outside the book into it. */
#define FIXED_LOOP(T)                                                                     \
    do {                                                                                  \
        uint64_t bad = 0;                                                                 \
        for (int64_t i = 0; i < m; i++) {                                                 \
            T x;                                                                          \
            memcpy(&x, v + i * (int64_t)sizeof(T), sizeof(T));                            \
            uint64_t d = (uint64_t)(int64_t)x - (uint64_t)low;                            \
            bad |= ((int64_t)x < low) | (d >= (uint64_t)n_codes);                         \
            c[i] = (uint8_t)d;                                                            \
        }                                                                                 \
        return bad == 0;                                                                  \
    } while (0)

static int fixed_codes(const uint8_t *v, int64_t m, char kind, size_t itemsize, int64_t low,
                       int64_t n_codes, uint8_t *c) {
    if (kind == 'b') {
        for (int64_t i = 0; i < m; i++) c[i] = v[i] != 0;
        return 1;
    }
    if (kind == 'i') {
        switch (itemsize) {
        case 1: FIXED_LOOP(int8_t);
        case 2: FIXED_LOOP(int16_t);
        case 4: FIXED_LOOP(int32_t);
        default: FIXED_LOOP(int64_t);
        }
    }
    switch (itemsize) {
    case 1: FIXED_LOOP(uint8_t);
    case 2: FIXED_LOOP(uint16_t);
    case 4: FIXED_LOOP(uint32_t);
    default: break;
    }
    /* uint64, which may hold values past INT64_MAX: below a low >= 0 is outside; with a
       low < 0, a value of n_codes or more is (value - low > value), and below it the
       difference fits */
    uint64_t bad = 0;
    for (int64_t i = 0; i < m; i++) {
        uint64_t x;
        memcpy(&x, v + 8 * i, 8);
        uint64_t d = x - (uint64_t)low;
        bad |= (low >= 0 ? x < (uint64_t)low : x >= (uint64_t)n_codes) |
               (d >= (uint64_t)n_codes);
        c[i] = (uint8_t)d;
    }
    return bad == 0;
}
#undef FIXED_LOOP

/* Codes of `m` values at `v` in the learned book `table` (`*size` entries in use, `map`
   its keys) into `c`, appending values new to it: 1, or 0 where it has no room left. */
static int learned_codes(const uint8_t *v, int64_t m, size_t itemsize, book_map *map,
                         uint8_t *table, Py_ssize_t *size, int64_t n_codes, uint8_t *c) {
    uint64_t last_key = 0;
    int64_t last = -1; /* the last value's code: rewards come in runs of one value */
    for (int64_t i = 0; i < m; i++) {
        const uint8_t *p = v + i * (int64_t)itemsize;
        uint64_t key = value_key(p, itemsize);
        if (key != last_key || last < 0) {
            size_t at;
            last = book_find(map, key, &at);
            if (last < 0) { /* a value new to the book */
                if (*size == n_codes) return 0;
                memcpy(table + *size * (Py_ssize_t)itemsize, p, itemsize);
                map->key[at] = key;
                map->code[at] = (int16_t)*size;
                last = (*size)++;
            }
            last_key = key;
        }
        c[i] = (uint8_t)last;
    }
    return 1;
}

/* `m` codes (each below 2**bits, bits 1, 2 or 4) packed into `out`, low bits first in
   each byte: the bytes written. */
static size_t pack_codes(const uint8_t *c, int64_t m, int bits, uint8_t *out) {
    const int64_t per = 8 / bits, whole = m / per;
    for (int64_t j = 0; j < whole; j++) {
        const uint8_t *g = c + j * per;
        unsigned b = 0;
        for (int64_t t = 0; t < per; t++) b |= (unsigned)g[t] << (t * bits);
        out[j] = (uint8_t)b;
    }
    if (m % per == 0) return (size_t)whole;
    unsigned b = 0;
    for (int64_t t = 0; t < m % per; t++) b |= (unsigned)c[whole * per + t] << (t * bits);
    out[whole] = (uint8_t)b;
    return (size_t)whole + 1;
}

static PyObject *code_rows(PyObject *self, PyObject *args) {
    PyObject *src_o, *starts_o, *counts_o, *low_o, *table_o, *dst_o, *dstart_o;
    int kind_c, bits;
    Py_ssize_t itemsize, size, slot_bytes;
    if (!PyArg_ParseTuple(args, "OOOCniOOnOOn", &src_o, &starts_o, &counts_o, &kind_c,
                          &itemsize, &bits, &low_o, &table_o, &size, &dst_o, &dstart_o,
                          &slot_bytes))
        return NULL;
    char kind = (char)kind_c;
    held_buffer src = {0}, st = {0}, ct = {0}, tab = {0}, dst = {0}, ds = {0};
    PyObject *result = NULL;
    book_map *map = NULL;
    int64_t low = 0;
    int fixed = low_o != Py_None;
    if (fixed) {
        low = PyLong_AsLongLong(low_o);
        if (low == -1 && PyErr_Occurred()) return NULL;
    }
    if ((bits != 1 && bits != 2 && bits != 4 && bits != 8) ||
        (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8) ||
        !(kind == 'b' || kind == 'i' || kind == 'u' || kind == 'f') ||
        (fixed && kind == 'f') || slot_bytes < 0) {
        PyErr_SetString(PyExc_ValueError, "code_rows: bits 1, 2, 4 or 8; itemsize 1, 2, 4 or "
                                          "8; kind 'b', 'i', 'u' or 'f' (a fixed book: not "
                                          "'f'); slot_bytes >= 0");
        return NULL;
    }
    if (take(src_o, &src, 0, 0, "src") || take(starts_o, &st, 8, 0, "starts") ||
        take(counts_o, &ct, 8, 0, "counts") || take(table_o, &tab, 0, 1, "table") ||
        take(dst_o, &dst, 0, 1, "dst") || take(dstart_o, &ds, 8, 0, "dst_starts"))
        goto done;
    const int64_t n_codes = (int64_t)1 << bits;
    Py_ssize_t n = st.view.len / 8;
    if (ct.view.len / 8 != n || ds.view.len / 8 != n || tab.view.len != n_codes * itemsize ||
        size < 0 || size > n_codes) {
        PyErr_SetString(PyExc_ValueError, "code_rows: starts, counts and dst_starts: one per "
                                          "shard; table: 2**bits entries of itemsize bytes, "
                                          "size of them in use");
        goto done;
    }
    const int64_t *starts = st.view.buf, *counts = ct.view.buf, *dstarts = ds.view.buf;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t packed = (counts[k] * bits + 7) / 8;
        if (counts[k] < 0 || starts[k] < 0 || starts[k] > src.view.len ||
            (src.view.len - starts[k]) / itemsize < counts[k] || packed > slot_bytes ||
            dstarts[k] < 0 || dstarts[k] > dst.view.len || dst.view.len - dstarts[k] < slot_bytes) {
            PyErr_Format(PyExc_IndexError, "code_rows: shard %zd out of range", k);
            goto done;
        }
    }
    uint8_t *table = tab.view.buf;
    if (!fixed) {
        map = PyMem_Malloc(sizeof *map);
        if (!map) {
            PyErr_NoMemory();
            goto done;
        }
        memset(map->code, 0xff, sizeof map->code);
        for (Py_ssize_t c = 0; c < size; c++) {
            size_t at;
            uint64_t key = value_key(table + c * itemsize, (size_t)itemsize);
            if (book_find(map, key, &at) < 0) {
                map->key[at] = key;
                map->code[at] = (int16_t)c;
            }
        }
    }
    Py_ssize_t k = 0;
    uint8_t *codes = NULL; /* a shard's codes, one byte each, before they are packed */
    int64_t most = 0;
    for (Py_ssize_t j = 0; j < n; j++) most = counts[j] > most ? counts[j] : most;
    if (bits != 8 && !(codes = PyMem_Malloc((size_t)most + 1))) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *s0 = src.view.buf;
    uint8_t *d0 = dst.view.buf;
    for (; k < n; k++) {
        uint8_t *out = d0 + dstarts[k];
        int64_t m = counts[k], size_before = size;
        uint8_t *c = bits == 8 ? out : codes;
        int ok = fixed ? fixed_codes(s0 + starts[k], m, kind, (size_t)itemsize, low, n_codes, c)
                       : learned_codes(s0 + starts[k], m, (size_t)itemsize, map, table, &size,
                                       n_codes, c);
        if (!ok) {
            size = size_before; /* (entries it added are unused) */
            break;
        }
        size_t o = bits == 8 ? (size_t)m : pack_codes(codes, m, bits, out);
        memset(out + o, 0, (size_t)slot_bytes - o);
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(codes);
    result = Py_BuildValue("(nn)", k, size);
done:
    PyMem_Free(map);
    release(&src), release(&st), release(&ct), release(&tab), release(&dst), release(&ds);
    return result;
}
