/* expstore.storage._step: a lane's shard buffers change inside an add (the common cases
 * of ``LaneWriter._hand_off`` and ``LaneWriter._enter_shard``, kept in step with them).
 * Included once, by ``_step.c`` (one translation unit: numpy's C API is imported there). */

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

/* load(lane): re-read lane ``lane`` after its writer moved to another shard buffer (handed a
   full one to the background writer, or opened the next): the writer's ``cur`` (its rows,
   first step, whether it was opened, its buffers' addresses) into the plan's table, and
   the writer's ``valid_from`` and committed count into the index (as
   ``RowIndex.set_valid_from`` does where no listener hears dropped rows: the plan is used
   only then). What ``LaneRows._load`` and ``Appender._moved`` do, without a numpy call.
   ``load_lane_of(c, handed)``: from buffer ``c``; ``handed``: just after ``hand_off`` made
   it current (no rows, not opened, the writer's ``valid_from`` unchanged: not read again). */
static int load_lane_of(Plan *self, Py_ssize_t j, PyObject *c, int handed) {
    PyObject *w = PyTuple_GET_ITEM(self->writers, j);
    int64_t n = 0, first, entered = 0, vf = 0, done;
    PyObject *at = NULL, *st = NULL;
    if ((!handed && (get_int(c, s_n, &n) || get_int(c, s_entered, &entered) ||
                     get_int(w, s_valid_from, &vf))) ||
        get_int(c, s_first_step, &first) || !(at = PyObject_GetAttr(c, s_addresses)) ||
        !(st = PyObject_GetAttr(w, s_committed)) || get_int(st, s_count, &done))
        goto fail;
    const int64_t *a = array_ptr(at, NPY_INT64, self->F + 1, "addresses");
    if (a == NULL) goto fail;
    for (Py_ssize_t f = 0; f < self->F; f++) self->base[f * self->L + j] = a[f];
    self->pub[j] = a[self->F];
    self->n[j] = n, self->first[j] = first, self->entered[j] = entered != 0;
    if (!handed && vf > self->valid_from[j]) self->valid_from[j] = vf;
    self->committed[j] = done;
    Py_DECREF(at);
    Py_DECREF(st);
    Py_INCREF(c);
    PyList_SetItem(self->curs, j, c); /* (steals the reference) */
    return 0;
fail:
    Py_XDECREF(at);
    Py_XDECREF(st);
    return -1;
}

static int load_lane(Plan *self, Py_ssize_t j) {
    PyObject *c = PyObject_GetAttr(PyTuple_GET_ITEM(self->writers, j), s_cur);
    if (c == NULL) return -1;
    int r = load_lane_of(self, j, c, 0);
    Py_DECREF(c);
    return r;
}

static PyObject *Plan_load(Plan *self, PyObject *arg) {
    Py_ssize_t j = PyLong_AsSsize_t(arg);
    if (j == -1 && PyErr_Occurred()) return NULL;
    if (j < 0 || j >= self->L || PyTuple_GET_ITEM(self->writers, j) == Py_None) {
        PyErr_Format(PyExc_ValueError, "StepPlan.load: lane %zd is not written here", j);
        return NULL;
    }
    if (load_lane(self, j)) return NULL;
    Py_RETURN_NONE;
}

/* Lane ``j``'s next row opens a shard: the common case of ``LaneWriter._enter_shard`` (keep
   the two in step), then ``load_lane``: the current buffer (a clean one in shared staging)
   starts at the lane's next step, other processes see it begin with no rows (the buffer's
   words in shared staging, as ``SharedStaging.begin``: generation odd while they change),
   and rows of the previous lap in its slots are no longer valid. 1: done; 0: nothing
   changed, the caller's Python path opens it (a private buffer to promote, or one to
   reset); -1: an exception. */
static int enter(Plan *self, Py_ssize_t j) {
    PyObject *w = PyTuple_GET_ITEM(self->writers, j);
    PyObject *cur = NULL, *clean = NULL, *at = NULL, *x = NULL;
    int64_t slot, count, vf;
    int out = -1;
    if (!(cur = PyObject_GetAttr(w, s_cur)) || get_int(cur, s_slot, &slot) ||
        !(clean = PyObject_GetAttr(cur, s_clean)) || !(at = PyObject_GetAttr(cur, s_addresses)))
        goto done;
    const int64_t *a = array_ptr(at, NPY_INT64, self->F + 1, "addresses");
    if (a == NULL) goto done;
    if (slot < 0 || clean != Py_True || a[self->F] == 0) {
        out = 0;
        goto done;
    }
    if (get_int(w, s_count, &count) || get_int(w, s_valid_from, &vf)) goto done;
    if (!(x = PyLong_FromLongLong(count)) || PyObject_SetAttr(cur, s_first_step, x)) goto done;
    Py_CLEAR(x);
    int64_t *word = (int64_t *)(intptr_t)a[self->F]; /* its published rows; before: gen, first */
    int64_t gen = word[-2];
    __atomic_store_n(&word[-2], gen + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&word[-1], count, __ATOMIC_RELAXED);
    __atomic_store_n(&word[0], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&word[-2], gen + 2, __ATOMIC_RELEASE);
    int64_t from = count + self->S - self->lane_cap;
    if (from > vf) {
        if (!(x = PyLong_FromLongLong(from)) || PyObject_SetAttr(w, s_valid_from, x)) goto done;
    }
    if (PyObject_SetAttr(cur, s_entered, Py_True) || load_lane(self, j)) goto done;
    out = 1;
done:
    Py_XDECREF(cur), Py_XDECREF(clean), Py_XDECREF(at), Py_XDECREF(x);
    return out;
}

/* Lane ``j``'s shard is full: the common case of ``LaneWriter._hand_off`` (keep the two in
   step), then ``load_lane``. The shard is queued for its background thread and a free
   buffer becomes current, all without running Python code: this runs inside the add that
   completes the shard. 1: done; 0: nothing changed, the caller's Python path hands it over
   (spare lineages to attach, failed writes pending, a halted writer, no free buffer, or a
   sleeping thread to wake); -1: an exception. */
static int hand_off(Plan *self, Py_ssize_t j) {
    PyObject *w = PyTuple_GET_ITEM(self->writers, j), *h = PyTuple_GET_ITEM(self->hands, j);
    if (h == Py_None || PyList_GET_SIZE(PyTuple_GET_ITEM(self->pending, j)) != 0) return 0;
    PyObject *free_ = PyTuple_GET_ITEM(h, 0), *queued = PyTuple_GET_ITEM(h, 1);
    PyObject *append = PyTuple_GET_ITEM(h, 2), *state = PyTuple_GET_ITEM(h, 3);
    Py_ssize_t last = PyList_GET_SIZE(free_) - 1;
    if (last < 0) return 0; /* (waiting for a free buffer: the Python path) */
    PyObject *sleeping = PyDict_GetItemWithError(state, s_sleeping); /* borrowed */
    if (sleeping != Py_False) return PyErr_Occurred() ? -1 : 0; /* (waking it: Python) */
    PyObject *spares = NULL, *halted = NULL, *sh = NULL, *job = NULL, *r = NULL, *cur = NULL;
    int out = -1;
    if (!(spares = PyObject_GetAttr(w, s_spares)) || !(halted = PyObject_GetAttr(w, s_halted)))
        goto done;
    if (!PyDict_Check(spares) || PyDict_GET_SIZE(spares) != 0 || halted != Py_False) {
        out = 0;
        goto done;
    }
    if (!(sh = PyObject_GetAttr(w, s_cur)) || !(job = PyTuple_Pack(2, w, sh))) goto done;
    cur = PyList_GET_ITEM(free_, last);
    Py_INCREF(cur);
    if (PyObject_SetAttr(sh, s_done, Py_False) || PyList_Append(queued, sh) ||
        !(r = PyObject_CallOneArg(append, job)) || PyList_SetSlice(free_, last, last + 1, NULL))
        goto done;
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) goto done;
    int bad = PyObject_SetAttr(cur, s_n, zero) || PyObject_SetAttr(cur, s_entered, Py_False) ||
              PyObject_SetAttr(w, s_cur, cur);
    Py_DECREF(zero);
    if (bad || load_lane_of(self, j, cur, 1)) goto done;
    out = 1;
done:
    Py_XDECREF(spares), Py_XDECREF(halted), Py_XDECREF(sh), Py_XDECREF(job);
    Py_XDECREF(r), Py_XDECREF(cur);
    return out;
}

