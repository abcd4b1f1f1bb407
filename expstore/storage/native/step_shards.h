/* expstore.storage.native._step: a lane's shard buffers change inside an add: the fast path of
 * the common cases of ``LaneWriter._hand_off`` and ``LaneWriter._enter_shard``, which define
 * them (``tests/test_step_kernel.py`` holds the two to the same state after every add).
 * Included once, by ``_step.c`` (one translation unit: numpy's C API is imported there).
 *
 * These run once in ``shard_rows`` adds, when little of what they touch is still in the
 * CPU's caches, so they touch few Python objects: a buffer's state is its record (int64
 * words at ``rec_at``, ``shard_buffer.py``), what a hand-off changes is in ``hands``
 * (lists and one-element arrays), and the writer's ``cur`` is the plan's ``curs[j]``
 * (kept equal to it: by ``hand_off`` and ``load`` here, by ``LaneRows._load`` before any
 * call that stages rows after the Python paths moved it). */

/* attribute ``name`` of ``o`` as an int64 (-1 and an exception set on failure) */
static int get_int(PyObject *o, PyObject *name, int64_t *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    *out = (int64_t)x;
    return 0;
}

/* the plan's table entry of lane ``j`` from its current buffer's record */
static void table_from(Plan *self, Py_ssize_t j, const int64_t *rec, int64_t rec_at) {
    const int64_t *a = rec + R_ADDRESSES;
    for (Py_ssize_t f = 0; f < self->F; f++) self->base[f * self->L + j] = a[f];
    self->pub[j] = a[self->F];
    self->n[j] = rec[R_N], self->first[j] = rec[R_FIRST], self->entered[j] = rec[R_ENTERED] != 0;
    self->rec[j] = rec_at;
}

/* load(lane): re-read lane ``lane`` after the writer's Python code moved it to another
   shard buffer (opened the next one, or handed a full one over): the writer's ``cur``
   into the plan's table and ``curs``, and the writer's ``valid_from`` and committed count
   into the index (as ``RowIndex.set_valid_from`` does where no listener hears dropped
   rows: the plan is used only then). What ``LaneRows._load`` does for the Python paths,
   without a numpy call. */
static PyObject *Plan_load(Plan *self, PyObject *arg) {
    Py_ssize_t j = PyLong_AsSsize_t(arg);
    if (j == -1 && PyErr_Occurred()) return NULL;
    if (j < 0 || j >= self->L || PyTuple_GET_ITEM(self->writers, j) == Py_None) {
        PyErr_Format(PyExc_ValueError, "StepPlan.load: lane %zd is not written here", j);
        return NULL;
    }
    PyObject *w = PyTuple_GET_ITEM(self->writers, j), *c = NULL, *st = NULL;
    int64_t rec_at, vf, done;
    if (!(c = PyObject_GetAttr(w, s_cur)) || get_int(c, s_rec_at, &rec_at) ||
        get_int(w, s_valid_from, &vf) || !(st = PyObject_GetAttr(w, s_committed)) ||
        get_int(st, s_count, &done)) {
        Py_XDECREF(c);
        Py_XDECREF(st);
        return NULL;
    }
    Py_DECREF(st);
    table_from(self, j, (const int64_t *)(intptr_t)rec_at, rec_at);
    if (vf > self->valid_from[j]) self->valid_from[j] = vf;
    self->committed[j] = done;
    PyList_SetItem(self->curs, j, c); /* (steals the reference) */
    Py_RETURN_NONE;
}

/* Lane ``j``'s next row opens a shard: the common case of ``LaneWriter._enter_shard`` (keep
   the two in step): the current buffer (a clean one in shared staging) starts at the
   lane's next step, other processes see it begin with no rows (the buffer's words in
   shared staging, as ``SharedStaging.begin``: generation odd while they change), rows of
   the previous lap in its slots are no longer valid, and the table follows the buffer.
   (The index's committed count is not re-read: ``Store._poll_writes`` sets it.) 1: done;
   0: nothing changed, the caller's Python path opens it (a private buffer to promote, or
   one to reset); -1: an exception. */
static int enter(Plan *self, Py_ssize_t j) {
    PyObject *w = PyTuple_GET_ITEM(self->writers, j), *x = NULL;
    int64_t rec_at, count, vf;
    if (get_int(PyList_GET_ITEM(self->curs, j), s_rec_at, &rec_at)) return -1;
    int64_t *rec = (int64_t *)(intptr_t)rec_at;
    if (rec[R_SLOT] < 0 || !rec[R_CLEAN] || rec[R_ADDRESSES + self->F] == 0) return 0;
    if (get_int(w, s_count, &count) || get_int(w, s_valid_from, &vf)) return -1;
    rec[R_FIRST] = count;
    int64_t *word = (int64_t *)(intptr_t)rec[R_ADDRESSES + self->F]; /* published rows;
                                                                         before: gen, first */
    int64_t gen = word[-2];
    __atomic_store_n(&word[-2], gen + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&word[-1], count, __ATOMIC_RELAXED);
    __atomic_store_n(&word[0], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&word[-2], gen + 2, __ATOMIC_RELEASE);
    int64_t from = count + self->S - self->lane_cap;
    if (from > vf) {
        if (!(x = PyLong_FromLongLong(from)) || PyObject_SetAttr(w, s_valid_from, x)) {
            Py_XDECREF(x);
            return -1;
        }
        Py_DECREF(x);
        vf = from;
    }
    rec[R_ENTERED] = 1;
    table_from(self, j, rec, rec_at);
    if (vf > self->valid_from[j]) self->valid_from[j] = vf;
    return 1;
}

/* Lane ``j``'s shard is full: the common case of ``LaneWriter._hand_off`` (keep the two in
   step). The shard is queued for its background thread and a free buffer becomes current,
   without running Python code and without allocating. A free buffer already has no rows
   and is not opened (``LaneWriter._recycle``). 1: done; 0: nothing changed, the caller's
   Python path hands it over (failed writes pending; the writer's gate set: spare lineages
   to attach, or writes halted; no free buffer; the thread's job ring full, or the thread
   asleep, to be woken); -1: an exception. */
static int hand_off(Plan *self, Py_ssize_t j) {
    PyObject *w = PyTuple_GET_ITEM(self->writers, j), *h = PyTuple_GET_ITEM(self->hands, j);
    if (h == Py_None || PyList_GET_SIZE(PyTuple_GET_ITEM(self->pending, j)) != 0 ||
        self->rec[j] == 0)
        return 0;
    PyObject *free_ = PyTuple_GET_ITEM(h, 0), *queued = PyTuple_GET_ITEM(h, 1);
    PyObject *ring_w = PyTuple_GET_ITEM(h, 2), *ring_s = PyTuple_GET_ITEM(h, 3);
    int64_t *ends = PyArray_DATA((PyArrayObject *)PyTuple_GET_ITEM(h, 4)); /* taken, added */
    const uint8_t *sleeping = PyArray_DATA((PyArrayObject *)PyTuple_GET_ITEM(h, 5));
    const uint8_t *gate = PyArray_DATA((PyArrayObject *)PyTuple_GET_ITEM(h, 6));
    Py_ssize_t last = PyList_GET_SIZE(free_) - 1, size = PyList_GET_SIZE(ring_s);
    if (last < 0 || *gate || *sleeping || size != PyList_GET_SIZE(ring_w) ||
        ends[1] - ends[0] >= size)
        return 0;
    PyObject *sh = PyList_GET_ITEM(self->curs, j); /* (borrowed: queued and the ring keep it) */
    PyObject *cur = PyList_GET_ITEM(free_, last);
    Py_INCREF(cur);
    if (PyList_Append(queued, sh) || PyList_SetSlice(free_, last, last + 1, NULL) ||
        PyObject_SetAttr(w, s_cur, cur)) {
        Py_DECREF(cur);
        return -1;
    }
    ((int64_t *)(intptr_t)self->rec[j])[R_DONE] = 0;
    /* the job, in slot ``added % size`` (holding None: the taker clears a slot it takes) */
    Py_ssize_t k = (Py_ssize_t)(ends[1] % size);
    PyObject *old_w = PyList_GET_ITEM(ring_w, k), *old_s = PyList_GET_ITEM(ring_s, k);
    Py_INCREF(w);
    PyList_SET_ITEM(ring_w, k, w);
    Py_INCREF(sh);
    PyList_SET_ITEM(ring_s, k, sh);
    ends[1] += 1; /* (under the GIL, as the taker reads it) */
    Py_DECREF(old_w);
    Py_DECREF(old_s);
    /* The table keeps the full buffer's addresses and first step: with no rows and not
       opened, the lane's next row opens the new buffer first (``enter``, which re-reads it
       all), and nothing is written through them before that. */
    self->n[j] = 0, self->entered[j] = 0, self->rec[j] = 0;
    PyList_SetItem(self->curs, j, cur); /* (steals the reference) */
    return 1;
}
