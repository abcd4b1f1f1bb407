/* expstore.storage.native._step: a lane's shard buffers change inside an add. Included once,
 * by ``_step.c`` (one translation unit: numpy's C API is imported there).
 *
 * The writer's Python moves a lane to another buffer (``LaneWriter._enter_shard``,
 * ``LaneWriter._hand_off``: the one place that does either, here called by ``move_lane``);
 * the plan then re-reads the lane (``load``): a buffer's state is its record (int64 words
 * at ``rec_at``, ``shard_buffer.py``), and the writer's ``cur`` is the plan's ``curs[j]``
 * (kept equal to it: by ``load`` here, by ``LaneRows._load`` before any call that stages
 * rows after the Python paths moved it). */

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

/* Lane ``j``'s writer moves it to another shard buffer: ``method`` is
   ``LaneWriter._enter_shard`` (its next row opens a shard) or ``LaneWriter._hand_off`` (its
   shard is full: queued for its background thread, a free buffer made current). The
   writer's Python is the one place that does either; here the lane is only re-read after
   it (``load``), even when the method raised (whose exception is kept). 0, or -1 with an
   exception set. Once in ``shard_rows`` adds of a lane. */
static int move_lane(Plan *self, Py_ssize_t j, PyObject *method) {
    PyObject *w = PyTuple_GET_ITEM(self->writers, j);
    PyObject *r = PyObject_CallMethodNoArgs(w, method);
    PyObject *type, *value, *tb;
    if (r == NULL) PyErr_Fetch(&type, &value, &tb);
    Py_XDECREF(r);
    PyObject *idx = PyLong_FromSsize_t(j), *loaded = idx ? Plan_load(self, idx) : NULL;
    Py_XDECREF(idx);
    Py_XDECREF(loaded);
    if (r == NULL) {
        if (loaded == NULL) PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return -1;
    }
    return loaded == NULL ? -1 : 0;
}
