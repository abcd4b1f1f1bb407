/* expstore.storage.native._kernels: a whole batch of small fields gathered from the
 * reader's hot set (``ShardTable`` decoded values) in one call. Included once, by
 * ``_kernels.c``.
 *
 *   gather_held(shard_rows, spl, known, locs, jobs, copy) -> bool
 *       ``locs``: a tuple of ``(rows, steps)`` pairs (int64, one entry per row each) or
 *       ``(rows, steps, skip)`` triples (``skip``: bool per row, rows neither checked,
 *       written nor counted: the caller's, e.g. rows still staged);
 *       ``jobs``: a tuple of ``(loc, first, n_rows, trusted, slot, values, out, code)``:
 *       the rows of ``locs[loc]`` of one field, out of its ``ShardTable`` arrays
 *       (``first``, ``n_rows``, ``trusted``, ``slot``: int64 per shard; ``values``: the
 *       value slots, ``shard_rows`` rows each) into ``out`` (one row per entry). ``code``:
 *       ``None``, or ``(bits, table)`` where the slots hold each row's code in ``bits``
 *       bits (1, 2, 4 or 8, low bits first in each byte; ``scalar_codes.py``) and
 *       ``table`` its value (``2 ** bits`` entries of ``out``'s row size). When every row of every
 *       job is held by a cached, trusted version (as ``table_rows`` checks), and ``copy``,
 *       each ``out[i]`` is written (one memcpy per row, without the GIL) and ``known[lane]``
 *       raised to ``step + 1`` for every row's lane (``spl`` shards per lane): True. Else
 *       False and nothing written (``copy`` false: only the check).
 *       A job may carry two more items, ``(..., code, staged, staged_first)``: per lane, the
 *       field's rows a writer of this process staged (``staged[lane]``: C-contiguous, one
 *       row per staged step from ``staged_first[lane]`` on, int64 per lane; ``None`` for a
 *       lane without one); the job's skipped rows are then copied from there, each of them
 *       staged or the call returns False (a learner sampling the lanes it writes: most
 *       batches hold a row of the shard being filled).
 */

#define GATHER_JOB 8

/* The staged row of step ``step`` in lane ``lane`` of a job's staging (``sb``: one
   buffer per lane, ``firsts``: their first steps), or NULL where it holds none. */
static inline const uint8_t *staged_row(const held_buffer *sb, const int64_t *firsts,
                                        Py_ssize_t lanes, int64_t lane, int64_t step,
                                        size_t row_bytes) {
    if (lane < 0 || lane >= lanes || !sb[lane].held) return NULL;
    int64_t at = step - firsts[lane];
    if (at < 0 || (size_t)(at + 1) * row_bytes > (size_t)sb[lane].view.len) return NULL;
    return (const uint8_t *)sb[lane].view.buf + (size_t)at * row_bytes;
}

/* Rows asked for at once: each block's addresses are computed and prefetched before any
   of its values is read, so a batch over a hot set larger than the caches waits for
   its misses together, not one after another. */
#define GATHER_BLOCK 64

/* The shard of row ``r``: a shift where ``shard_rows`` is a power of two (``shift``
   >= 0; every store's default), else a division. */
static inline int64_t shard_of(int64_t r, Py_ssize_t shard_rows, int shift) {
    return shift >= 0 ? r >> shift : r / shard_rows;
}

/* ``log2(shard_rows)`` for a power of two, else -1. */
static inline int shard_shift(Py_ssize_t shard_rows) {
    return shard_rows > 0 && (shard_rows & (shard_rows - 1)) == 0
               ? __builtin_ctzll((unsigned long long)shard_rows) : -1;
}

/* One value of ``row_bytes`` from ``src`` to ``dst`` (fixed sizes inlined). */
static inline void copy_value(uint8_t *dst, const uint8_t *src, size_t row_bytes) {
    switch (row_bytes) {
    case 1: *dst = *src; break;
    case 4: memcpy(dst, src, 4); break;
    case 8: memcpy(dst, src, 8); break;
    default: memcpy(dst, src, row_bytes);
    }
}

/* Rows of one field into ``out``: each row's value slot (``per_slot`` bytes a shard's
   slot), or, where ``bits`` > 0, each row's code in ``bits`` bits looked up in
   ``table`` (``row_bytes`` a value). */
static void gather_rows(const uint8_t *values, const uint8_t *table, int bits,
                        Py_ssize_t shard_rows, int shift, const int64_t *rows,
                        const int64_t *slot, const uint8_t *skip, Py_ssize_t n, uint8_t *out,
                        size_t row_bytes) {
    size_t per_slot = bits ? ((size_t)shard_rows * (size_t)bits + 7) / 8
                           : (size_t)shard_rows * row_bytes;
    unsigned mask = bits ? (1u << bits) - 1 : 0;
    const uint8_t *src[GATHER_BLOCK];
    unsigned char low[GATHER_BLOCK];
    for (Py_ssize_t i0 = 0; i0 < n; i0 += GATHER_BLOCK) {
        Py_ssize_t m = n - i0 < GATHER_BLOCK ? n - i0 : GATHER_BLOCK;
        for (Py_ssize_t k = 0; k < m; k++) {
            Py_ssize_t i = i0 + k;
            if (skip && skip[i]) {
                src[k] = NULL;
                continue;
            }
            int64_t s = shard_of(rows[i], shard_rows, shift), at = rows[i] - s * shard_rows;
            const uint8_t *base = values + (size_t)slot[s] * per_slot;
            if (bits) {
                size_t bit = (size_t)at * (size_t)bits;
                src[k] = base + (bit >> 3);
                low[k] = (unsigned char)(bit & 7);
            } else {
                src[k] = base + (size_t)at * row_bytes;
            }
            __builtin_prefetch(src[k]);
        }
        for (Py_ssize_t k = 0; k < m; k++) {
            if (!src[k]) continue;
            const uint8_t *from = bits ? table + (size_t)((*src[k] >> low[k]) & mask) * row_bytes
                                       : src[k];
            copy_value(out + (size_t)(i0 + k) * row_bytes, from, row_bytes);
        }
    }
}

static PyObject *gather_held(PyObject *self, PyObject *args) {
    Py_ssize_t shard_rows, spl;
    PyObject *known_o, *locs, *jobs;
    int copy;
    if (!PyArg_ParseTuple(args, "nnOO!O!p", &shard_rows, &spl, &known_o, &PyTuple_Type, &locs,
                          &PyTuple_Type, &jobs, &copy))
        return NULL;
    Py_ssize_t n_locs = PyTuple_GET_SIZE(locs), n_jobs = PyTuple_GET_SIZE(jobs);
    if (shard_rows <= 0 || spl <= 0) {
        PyErr_SetString(PyExc_ValueError, "gather_held: shard_rows and spl > 0");
        return NULL;
    }
    held_buffer known = {0};
    /* (zeroed: release() of a buffer never taken is a no-op) */
    held_buffer *lb = PyMem_Calloc((size_t)(3 * n_locs + 1), sizeof *lb);
    held_buffer *jb = PyMem_Calloc((size_t)(GATHER_JOB * n_jobs + 1), sizeof *jb);
    Py_ssize_t *job_loc = PyMem_Calloc((size_t)(n_jobs + 1), sizeof *job_loc);
    held_buffer **staged = PyMem_Calloc((size_t)(n_jobs + 1), sizeof *staged);
    held_buffer *firsts = PyMem_Calloc((size_t)(n_jobs + 1), sizeof *firsts);
    int *code_bits = PyMem_Calloc((size_t)(n_jobs + 1), sizeof *code_bits);
    Py_ssize_t lanes = 0;
    int shift = shard_shift(shard_rows);
    PyObject *result = NULL;
    if (!lb || !jb || !job_loc || !staged || !firsts || !code_bits) {
        PyErr_NoMemory();
        goto done;
    }
    if (take(known_o, &known, 8, 1, "known")) goto done;
    for (Py_ssize_t l = 0; l < n_locs; l++) {
        PyObject *pair = PyTuple_GET_ITEM(locs, l);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) < 2 || PyTuple_GET_SIZE(pair) > 3) {
            PyErr_SetString(PyExc_TypeError, "gather_held: locs holds (rows, steps[, skip])");
            goto done;
        }
        if (take(PyTuple_GET_ITEM(pair, 0), &lb[3 * l], 8, 0, "rows") ||
            take(PyTuple_GET_ITEM(pair, 1), &lb[3 * l + 1], 8, 0, "steps") ||
            (PyTuple_GET_SIZE(pair) == 3 &&
             take_ints(PyTuple_GET_ITEM(pair, 2), &lb[3 * l + 2], 1, 0, "skip")))
            goto done;
        if (lb[3 * l].view.len != lb[3 * l + 1].view.len ||
            (lb[3 * l + 2].held && lb[3 * l + 2].view.len * 8 != lb[3 * l].view.len)) {
            PyErr_SetString(PyExc_ValueError, "gather_held: rows, steps and skip differ in "
                                              "length");
            goto done;
        }
    }
    static const char *names[] = {"first", "n_rows", "trusted", "slot", "values", "out"};
    lanes = known.view.len / 8;
    for (Py_ssize_t j = 0; j < n_jobs; j++) {
        PyObject *job = PyTuple_GET_ITEM(jobs, j);
        if (!PyTuple_Check(job) ||
            (PyTuple_GET_SIZE(job) != GATHER_JOB && PyTuple_GET_SIZE(job) != GATHER_JOB + 2)) {
            PyErr_SetString(PyExc_TypeError, "gather_held: jobs holds tuples of 8 or 10");
            goto done;
        }
        Py_ssize_t loc = PyLong_AsSsize_t(PyTuple_GET_ITEM(job, 0));
        if (loc < 0 || loc >= n_locs) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_IndexError, "gather_held: a job's loc is out of range");
            goto done;
        }
        job_loc[j] = loc;
        held_buffer *b = jb + GATHER_JOB * j;
        for (int k = 0; k < 6; k++)
            if (take(PyTuple_GET_ITEM(job, k + 1), &b[k], k < 4 ? 8 : 0, k == 5, names[k]))
                goto done;
        Py_ssize_t n = lb[3 * loc].view.len / 8, n_shards = b[0].view.len / 8;
        if (b[1].view.len / 8 != n_shards || b[2].view.len / 8 != n_shards ||
            b[3].view.len / 8 != n_shards || n_shards / spl > lanes ||
            (n ? b[5].view.len % n != 0 : b[5].view.len != 0)) {
            PyErr_SetString(PyExc_ValueError, "gather_held: first/n_rows/trusted/slot per "
                                              "shard, out of one entry per row");
            goto done;
        }
        PyObject *code = PyTuple_GET_ITEM(job, GATHER_JOB - 1);
        if (code != Py_None) { /* (bits, table): the slots hold codes */
            long bits_l;
            if (!PyTuple_Check(code) || PyTuple_GET_SIZE(code) != 2 ||
                (bits_l = PyLong_AsLong(PyTuple_GET_ITEM(code, 0))) < 0) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "gather_held: code is (bits, table)");
                goto done;
            }
            if (take(PyTuple_GET_ITEM(code, 1), &b[6], 0, 0, "table")) goto done;
            code_bits[j] = (int)bits_l;
            if ((bits_l != 1 && bits_l != 2 && bits_l != 4 && bits_l != 8) ||
                (n && b[6].view.len != (b[5].view.len / n) << bits_l)) {
                PyErr_SetString(PyExc_ValueError, "gather_held: code bits 1, 2, 4 or 8, its "
                                                  "table 2**bits rows of out's row size");
                goto done;
            }
        }
        if (PyTuple_GET_SIZE(job) == GATHER_JOB + 2) {  /* this process's staged rows */
            PyObject *sb_o = PyTuple_GET_ITEM(job, GATHER_JOB);
            if (!PyTuple_Check(sb_o) || PyTuple_GET_SIZE(sb_o) != lanes) {
                PyErr_SetString(PyExc_TypeError, "gather_held: staged holds one entry per lane");
                goto done;
            }
            staged[j] = PyMem_Calloc((size_t)lanes + 1, sizeof(held_buffer));
            if (staged[j] == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            if (take(PyTuple_GET_ITEM(job, GATHER_JOB + 1), &firsts[j], 8, 0, "staged_first"))
                goto done;
            if (firsts[j].view.len != lanes * 8) {
                PyErr_SetString(PyExc_ValueError, "gather_held: staged_first: one per lane");
                goto done;
            }
            for (Py_ssize_t k = 0; k < lanes; k++)
                if (PyTuple_GET_ITEM(sb_o, k) != Py_None &&
                    take(PyTuple_GET_ITEM(sb_o, k), &staged[j][k], 0, 0, "staged"))
                    goto done;
        }
        if (n == 0) continue;
        const int64_t *rows = lb[3 * loc].view.buf, *steps = lb[3 * loc + 1].view.buf;
        const uint8_t *skip = lb[3 * loc + 2].held ? lb[3 * loc + 2].view.buf : NULL;
        const int64_t *first = b[0].view.buf, *n_rows = b[1].view.buf;
        const int64_t *trusted = b[2].view.buf, *slot = b[3].view.buf;
        Py_ssize_t row_bytes = b[5].view.len / n;
        Py_ssize_t per_slot = code_bits[j] ? (shard_rows * code_bits[j] + 7) / 8
                                           : shard_rows * row_bytes;
        Py_ssize_t pool = per_slot ? b[4].view.len / per_slot : 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (skip && skip[i]) {
                if (staged[j] && !staged_row(staged[j], firsts[j].view.buf, lanes,
                                             shard_of(rows[i], shard_rows, shift) / spl, steps[i],
                                             (size_t)row_bytes)) {
                    result = Py_False; /* (not staged here: the caller's path) */
                    goto done;
                }
                continue;
            }
            int64_t r = rows[i], s = shard_of(r, shard_rows, shift), at = r - s * shard_rows;
            if (r < 0 || s >= n_shards || first[s] < 0 || first[s] + at != steps[i] ||
                at >= n_rows[s] || steps[i] >= trusted[s] || slot[s] < 0 || slot[s] >= pool) {
                result = Py_False; /* (a row the hot set does not hold: the caller's path) */
                goto done;
            }
        }
    }
    if (copy) {
        int64_t *kn = known.view.buf;
        /* staged rows first, with the GIL held: a writer of this process stages rows and
           recycles its buffers under the GIL, so none changes while they are copied */
        for (Py_ssize_t j = 0; j < n_jobs; j++) {
            Py_ssize_t loc = job_loc[j], n = lb[3 * loc].view.len / 8;
            if (!staged[j] || n == 0 || !lb[3 * loc + 2].held) continue;
            const int64_t *rows = lb[3 * loc].view.buf, *steps = lb[3 * loc + 1].view.buf;
            const uint8_t *skip = lb[3 * loc + 2].view.buf;
            uint8_t *out = jb[GATHER_JOB * j + 5].view.buf;
            size_t row_bytes = (size_t)(jb[GATHER_JOB * j + 5].view.len / n);
            for (Py_ssize_t i = 0; i < n; i++)
                if (skip[i])
                    memcpy(out + i * row_bytes,
                           staged_row(staged[j], firsts[j].view.buf, lanes,
                                      shard_of(rows[i], shard_rows, shift) / spl, steps[i],
                                      row_bytes),
                           row_bytes);
        }
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t j = 0; j < n_jobs; j++) {
            held_buffer *b = jb + GATHER_JOB * j;
            Py_ssize_t loc = job_loc[j];
            Py_ssize_t n = lb[3 * loc].view.len / 8;
            if (n == 0) continue;
            const int64_t *rows = lb[3 * loc].view.buf, *slot = b[3].view.buf;
            const uint8_t *skip = lb[3 * loc + 2].held ? lb[3 * loc + 2].view.buf : NULL;
            const uint8_t *values = b[4].view.buf;
            uint8_t *out = b[5].view.buf;
            size_t row_bytes = (size_t)(b[5].view.len / n);
            gather_rows(values, code_bits[j] ? b[6].view.buf : NULL, code_bits[j],
                        shard_rows, shift, rows, slot, skip, n, out, row_bytes);
        }
        for (Py_ssize_t l = 0; l < n_locs; l++) { /* steps asked for are committed */
            const int64_t *rows = lb[3 * l].view.buf, *steps = lb[3 * l + 1].view.buf;
            const uint8_t *skip = lb[3 * l + 2].held ? lb[3 * l + 2].view.buf : NULL;
            for (Py_ssize_t i = 0, n = lb[3 * l].view.len / 8; i < n; i++) {
                if (skip && skip[i]) continue;
                int64_t lane = shard_of(rows[i], shard_rows, shift) / spl;
                if (lane < lanes && kn[lane] < steps[i] + 1) kn[lane] = steps[i] + 1;
            }
        }
        Py_END_ALLOW_THREADS
    }
    result = Py_True;
done:
    release(&known);
    for (Py_ssize_t l = 0; lb && l < 3 * n_locs; l++) release(&lb[l]);
    for (Py_ssize_t j = 0; jb && j < GATHER_JOB * n_jobs; j++) release(&jb[j]);
    for (Py_ssize_t j = 0; staged && j < n_jobs; j++) {
        for (Py_ssize_t k = 0; staged[j] && k < lanes; k++) release(&staged[j][k]);
        PyMem_Free(staged[j]);
        if (firsts) release(&firsts[j]);
    }
    PyMem_Free(lb);
    PyMem_Free(jb);
    PyMem_Free(job_loc);
    PyMem_Free(staged);
    PyMem_Free(firsts);
    PyMem_Free(code_bits);
    Py_XINCREF(result);
    return result;
}
