/* expstore.storage.native._kernels: a batch's bookkeeping around the reads, one loop each instead
 * of a dozen numpy calls (the numpy code they replace stays where this is not built; tests
 * compare the two). Included once, by ``_kernels.c``.
 *
 *   first_index(keys, first, inv) -> u, or None where a key is < 0
 *       distinct keys in order of first appearance: key j's first position first[j]
 *       (j < u), and inv[i] = j where keys[i] is key j (``np.unique``'s index and
 *       inverse, in first-appearance order instead of sorted).
 *   table_rows(shards, slots, steps, first, n_rows, trusted, slot, values, shard_rows,
 *              out) -> bool
 *       ``ShardTable``: when every row i is held by a cached, trusted shard version
 *       (first[s] >= 0, first[s] + slots[i] == steps[i], slots[i] < n_rows[s],
 *       steps[i] < trusted[s], slot[s] >= 0 for s = shards[i]), out[i] = row slots[i] of
 *       values[slot[s]] (``shard_rows`` rows per value slot), and True; else False and
 *       nothing written.
 *   place_rows(rows, steps, servable, cacheable, tag, step, n, scratch, pos, hit, own)
 *       -> bool: ``RowCache.place`` (see there; ``tag``: each slot's row + 1, 0: empty);
 *       False where more rows need scratch than ``scratch`` (nothing changed).
 *   rows_held(state, shards, slots, steps, out)
 *       ``FdTable.ready``: out[i] = whether the shard version the ReadState's tab holds
 *       open for shards[i] holds steps[i] at slots[i] and is trusted for it.
 */

/* an open-addressing set of int64 keys >= 0 (a batch's slots or keys), or a map key -> j */
typedef struct {
    int64_t *keys, *vals;
    size_t mask;
} small_map;

static int map_init(small_map *m, Py_ssize_t n) {
    size_t size = 16;
    while (size < (size_t)n * 2) size <<= 1;
    m->keys = PyMem_Malloc(size * sizeof(int64_t) * 2);
    if (m->keys == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    m->vals = m->keys + size;
    m->mask = size - 1;
    memset(m->keys, 0xff, size * sizeof(int64_t)); /* -1: empty */
    return 0;
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

/* the value stored for ``key`` (>= 0), or store ``val`` for it and answer -1 */
static inline int64_t map_get_or_put(small_map *m, int64_t key, int64_t val) {
    size_t h = mix64((uint64_t)key) & m->mask;
    while (m->keys[h] != -1) {
        if (m->keys[h] == key) return m->vals[h];
        h = (h + 1) & m->mask;
    }
    m->keys[h] = key;
    m->vals[h] = val;
    return -1;
}

static PyObject *first_index(PyObject *self, PyObject *args) {
    PyObject *keys_o, *first_o, *inv_o;
    if (!PyArg_ParseTuple(args, "OOO", &keys_o, &first_o, &inv_o)) return NULL;
    held_buffer kb = {0}, fb = {0}, ib = {0};
    small_map m = {0};
    PyObject *result = NULL;
    if (take(keys_o, &kb, 8, 0, "keys") || take(first_o, &fb, 8, 1, "first") ||
        take(inv_o, &ib, 8, 1, "inv"))
        goto done;
    Py_ssize_t n = kb.view.len / 8;
    if (fb.view.len / 8 < n || ib.view.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "first, inv: expected room for one entry per key");
        goto done;
    }
    const int64_t *keys = kb.view.buf;
    int64_t *first = fb.view.buf, *inv = ib.view.buf, u = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (keys[i] < 0) { /* (the caller's numpy path takes any key) */
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
    if (map_init(&m, n)) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t j = map_get_or_put(&m, keys[i], u);
        if (j < 0) {
            first[u] = i;
            j = u++;
        }
        inv[i] = j;
    }
    result = PyLong_FromLongLong(u);
done:
    PyMem_Free(m.keys);
    release(&kb), release(&fb), release(&ib);
    return result;
}

static PyObject *table_rows(PyObject *self, PyObject *args) {
    PyObject *o[9];
    Py_ssize_t shard_rows;
    if (!PyArg_ParseTuple(args, "OOOOOOOOnO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6],
                          &o[7], &shard_rows, &o[8]))
        return NULL;
    static const char *names[] = {"shards", "slots", "steps", "first", "n_rows", "trusted",
                                  "slot", "values", "out"};
    held_buffer b[9];
    memset(b, 0, sizeof b);
    PyObject *result = NULL;
    for (int i = 0; i < 9; i++)
        if (take(o[i], &b[i], i < 7 ? 8 : 0, i == 8, names[i])) goto done;
    Py_ssize_t n = b[0].view.len / 8, n_shards = b[3].view.len / 8;
    if (b[1].view.len / 8 != n || b[2].view.len / 8 != n || b[4].view.len / 8 != n_shards ||
        b[5].view.len / 8 != n_shards || b[6].view.len / 8 != n_shards || n == 0 ||
        shard_rows <= 0 || b[8].view.len % n != 0) {
        PyErr_SetString(PyExc_ValueError, "table_rows: expected shards/slots/steps/out of one "
                                          "entry per row, first/n_rows/trusted/slot per shard");
        goto done;
    }
    const int64_t *shards = b[0].view.buf, *slots = b[1].view.buf, *steps = b[2].view.buf;
    const int64_t *first = b[3].view.buf, *n_rows = b[4].view.buf, *trusted = b[5].view.buf;
    const int64_t *slot = b[6].view.buf;
    Py_ssize_t row_bytes = b[8].view.len / n, per_slot = shard_rows * row_bytes;
    Py_ssize_t pool = per_slot ? b[7].view.len / per_slot : 0; /* value slots held */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t s = shards[i];
        if (s < 0 || s >= n_shards || first[s] < 0 || first[s] + slots[i] != steps[i] ||
            slots[i] < 0 || slots[i] >= n_rows[s] || slots[i] >= shard_rows ||
            steps[i] >= trusted[s] || slot[s] < 0 || slot[s] >= pool) {
            result = Py_False; /* (a row the table does not hold: the caller's path) */
            goto done;
        }
    }
    const uint8_t *values = b[7].view.buf;
    uint8_t *out = b[8].view.buf;
    for (Py_ssize_t i = 0; i < n; i++)
        memcpy(out + i * row_bytes, values + slot[shards[i]] * per_slot + slots[i] * row_bytes,
               (size_t)row_bytes);
    result = Py_True;
done:
    for (int i = 0; i < 9; i++) release(&b[i]);
    Py_XINCREF(result);
    return result;
}

static PyObject *place_rows(PyObject *self, PyObject *args) {
    PyObject *o[10];
    Py_ssize_t n_slots, scratch;
    if (!PyArg_ParseTuple(args, "OOOOOOnnOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &n_slots, &scratch, &o[6], &o[7], &o[8]))
        return NULL;
    static const char *names[] = {"rows", "steps", "servable", "cacheable", "tag", "step",
                                  "pos", "hit", "own"};
    static const int sizes[] = {8, 8, 1, 1, 8, 8, 8, 1, 1};
    held_buffer b[9];
    memset(b, 0, sizeof b);
    small_map m = {0};
    PyObject *result = NULL;
    for (int i = 0; i < 9; i++)
        if (take(o[i], &b[i], sizes[i], i == 4 || i >= 6, names[i])) goto done;
    Py_ssize_t n = b[0].view.len / 8;
    int ok = n_slots > 0 && scratch >= 0 && b[4].view.len / 8 == n_slots &&
             b[5].view.len / 8 == n_slots;
    for (int i = 1; i < 9; i++)
        if (i != 4 && i != 5 && b[i].view.len / sizes[i] != n) ok = 0;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "place_rows: expected rows/steps/servable/cacheable/"
                                          "pos/hit/own of one entry per row, tag/step per slot");
        goto done;
    }
    const int64_t *rows = b[0].view.buf, *steps = b[1].view.buf, *step = b[5].view.buf;
    const uint8_t *servable = b[2].view.buf, *cacheable = b[3].view.buf;
    int64_t *tag = b[4].view.buf, *pos = b[6].view.buf; /* (a slot's row + 1; 0: empty) */
    uint8_t *hit = b[7].view.buf, *own = b[8].view.buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (rows[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "rows: expected >= 0");
            goto done;
        }
    if (map_init(&m, n)) goto done;
    /* a hit keeps its slot; of the other rows wanting a slot, the first in order takes it */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t at = rows[i] % n_slots;
        hit[i] = servable[i] && tag[at] == rows[i] + 1 && step[at] == steps[i];
        if (hit[i]) map_get_or_put(&m, at, i);
    }
    Py_ssize_t spill = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t at = rows[i] % n_slots;
        own[i] = !hit[i] && cacheable[i] && map_get_or_put(&m, at, i) < 0;
        spill += !hit[i] && !own[i];
    }
    if (spill > scratch) {
        result = Py_False;
        goto done;
    }
    spill = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t at = rows[i] % n_slots;
        pos[i] = hit[i] || own[i] ? at : n_slots + spill++;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (own[i]) tag[rows[i] % n_slots] = 0; /* refilled by ``keep`` once decoded */
    result = Py_True;
done:
    PyMem_Free(m.keys);
    for (int i = 0; i < 9; i++) release(&b[i]);
    Py_XINCREF(result);
    return result;
}

/* rows_held: see the header (and the method table). */
static PyObject *rows_held(PyObject *self, PyObject *args) {
    ReadState *rs;
    PyObject *shards_o, *slots_o, *steps_o, *out_o;
    if (!PyArg_ParseTuple(args, "O!OOOO", &ReadStateType, &rs, &shards_o, &slots_o, &steps_o,
                          &out_o))
        return NULL;
    if (!rs->tab.held) {
        PyErr_SetString(PyExc_ValueError, "rows_held: the ReadState was not set up");
        return NULL;
    }
    held_buffer sh = {0}, sl = {0}, st = {0}, out = {0};
    PyObject *result = NULL;
    if (take(shards_o, &sh, 8, 0, "shards") || take(slots_o, &sl, 8, 0, "slots") ||
        take(steps_o, &st, 8, 0, "steps") || take(out_o, &out, 1, 1, "out"))
        goto done;
    Py_ssize_t n = sh.view.len / 8, n_shards = rs->tab.view.len / (8 * TAB_COLS);
    if (sl.view.len / 8 != n || st.view.len / 8 != n || out.view.len != n) {
        PyErr_SetString(PyExc_ValueError, "rows_held: shards, slots, steps and out need one "
                                          "entry per row");
        goto done;
    }
    const int64_t *shards = sh.view.buf, *slots = sl.view.buf, *steps = st.view.buf;
    const int64_t *tab = rs->tab.view.buf;
    uint8_t *o = out.view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (shards[i] < 0 || shards[i] >= n_shards) {
            PyErr_Format(PyExc_IndexError, "rows_held: shard of row %zd out of range", i);
            goto done;
        }
        o[i] = (uint8_t)holds(tab + shards[i] * TAB_COLS, slots[i], steps[i]);
    }
    result = Py_None;
    Py_INCREF(result);
done:
    release(&sh), release(&sl), release(&st), release(&out);
    return result;
}
