/* expstore.storage.native._step: one env step (one lane, or one step in every lane of a vector env)
 * staged with one call: the per-step fast path of ``Store.add``.
 *
 * A ``StepPlan`` is built once per store (``step_plan.py``) from the addresses the writer and
 * the index keep between calls: each lane's current shard buffer of every field, its rows
 * staged there, its published-count word in shared staging, the appender's episode
 * positions and held ``next_obs``, and the index's per-row arrays. ``plan.add(lane, obs,
 * action, reward, next_obs, terminated, truncated)`` (``lane = -1``: every lane, values with
 * leading axis ``lanes``) then, in C:
 *
 *   1. checks every value: the forms the Python checks accept without a cast, or with the
 *      casts they make (value-preserving for integers; float -> float as numpy casts),
 *      finite where the spec rejects non-finite values, within the field's bounds;
 *   2. compares each lane's obs with the ``next_obs`` it holds (byte for byte);
 *   3. writes each lane's row (and, where the step ends the episode, its final row) into
 *      the shard buffer, with step id, episode position and flags; the index's entries;
 *      the held ``next_obs``; then, after every row, the published row counts (readers in
 *      other processes see a row only once all of it is written), and the writer's and
 *      shard's Python counters.
 *
 * It returns ``False`` with nothing written when the step needs the general path: a value
 * it does not accept (the Python checks cast, clip, warn or raise naming the field), a
 * stream break (the held ``next_obs`` differs: a final row first, or ``strict`` raises), a
 * lane with a failed shard write waiting, a lane that was not set up, or (one lane) a
 * final row that would open the next shard. ``None`` when every lane's rows are written.
 * ``(1, lanes)``, nothing written: these lanes' next row opens a shard; the caller opens
 * it (``LaneWriter._enter_shard``) and calls again. ``(2, full, left)``: rows written
 * except in the lanes ``left`` (vector only: their final row would open the next shard;
 * the caller stages them through the Python path); the lanes ``full`` now hold a full
 * shard, which the caller hands to the background writer. (A lane whose shard fills is
 * handed over here, in C, in the common case (``hand_off``); ``full`` lists the others.)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <numpy/arrayscalars.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "buffers.h"       /* held_buffer, take, release */
#include "write_kernels.h" /* the batch kernels of _write.c, registered here */

enum { V_OBS = 0, V_ACTION, V_REWARD, V_TERM, V_TRUNC, NV };
/* a shard buffer's record (int64 words; ``shard_buffer.py``, the same order): rows staged,
   first step, opened, images clean, write done, staging slot, then the field buffers' and
   the published-count word's addresses */
enum { R_N = 0, R_FIRST, R_ENTERED, R_CLEAN, R_DONE, R_SLOT, R_ADDRESSES };
#define MAX_DIMS 8

typedef struct {
    int field;      /* index of the field in layout order */
    int type_num;   /* numpy type number of the field's dtype */
    char kind;      /* 'b', 'i', 'u', 'f' */
    int itemsize;
    Py_ssize_t elems;        /* elements per row */
    Py_ssize_t row_bytes;
    int ndim;
    npy_intp shape[MAX_DIMS];
    npy_intp stack;          /* frames per stack (0: not stacked) */
    int finite;              /* non-finite values need the general path */
    long long ilo, ihi;      /* integer scalars: accepted range */
    double flo, fhi, top, exact; /* float scalars: bounds, dtype's largest, exact ints */
    const double *alo, *ahi; /* per element bounds (NULL: none) */
} vfield;

typedef struct {
    PyObject_HEAD
    vfield v[NV];
    Py_ssize_t F, f_step, f_ep, f_flags, L, S, lane_cap;
    int64_t *base, *n, *first, *pub, *open_step, *count, *valid_from, *committed, *rec;
    uint8_t *held_ok, *held, *flags_idx, *entered;
    int32_t *ep_idx;
    Py_ssize_t held_bytes;
    uint8_t fl_first, fl_last, fl_term, fl_trunc;
    PyObject *keep;    /* the arrays above, held alive */
    PyObject *writers; /* tuple: lane -> LaneWriter or None */
    PyObject *pending; /* tuple: lane -> its writer's list of failed shard writes, or None */
    PyObject *curs;    /* list: lane -> the writer's open shard (kept current by the caller) */
    PyObject *hands;   /* tuple: lane -> (free buffers list, queued list, its thread's job
                          ring: writers list, shards list, ends int64[2] (``JobRing``), its
                          thread's sleeping byte, the writer's gate byte), or None (the
                          bytes: one-element uint8 arrays) */
    Py_ssize_t last_lane; /* the index's newest lane after the last call that wrote */
} Plan;

static PyObject *s_pending, *s_n, *s_count, *s_episodes, *s_cur, *s_rec_at, *s_valid_from,
    *s_committed;

#include "step_values.h"

/* ---- the plan ------------------------------------------------------------------------ */

/* The plan holds the writers (which reach the store back): the cycle collector must see
   through it, or a store that wrote a step would never be collected. */
static int Plan_traverse(Plan *self, visitproc visit, void *arg) {
    Py_VISIT(self->keep);
    Py_VISIT(self->writers);
    Py_VISIT(self->pending);
    Py_VISIT(self->curs);
    Py_VISIT(self->hands);
    return 0;
}

static int Plan_clear(Plan *self) {
    Py_CLEAR(self->keep);
    Py_CLEAR(self->writers);
    Py_CLEAR(self->pending);
    Py_CLEAR(self->curs);
    Py_CLEAR(self->hands);
    self->L = 0; /* cleared: every add answers False */
    return 0;
}

static void Plan_dealloc(Plan *self) {
    PyObject_GC_UnTrack(self);
    Plan_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static void *array_ptr(PyObject *o, int type_num, Py_ssize_t min_len, const char *what) {
    if (!PyArray_Check(o) || PyArray_TYPE((PyArrayObject *)o) != type_num ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)o) ||
        !PyArray_ISWRITEABLE((PyArrayObject *)o) ||
        PyArray_SIZE((PyArrayObject *)o) < min_len) {
        PyErr_Format(PyExc_ValueError, "StepPlan: %s: expected a writable C-contiguous "
                     "array of numpy type %d with at least %zd elements", what, type_num,
                     min_len);
        return NULL;
    }
    return PyArray_DATA((PyArrayObject *)o);
}

/* StepPlan(arrays, fields, consts, writers, curs, hands)
   arrays: (base (F, L) int64, n, first, pub, open_step, count: int64 per lane,
            held_ok bool (L), held uint8 (L, held_bytes), ep_idx int32, flags_idx uint8,
            entered uint8 (L): the lane's current shard was opened, then the index's
            valid_from and committed int64 (L), then rec int64 (L): the address of the
            lane's current shard buffer's record, 0: none)
   fields: per value field (obs, action, reward, terminated, truncated): (field index,
           type_num, kind, itemsize, shape, stack, finite, ilo, ihi, flo, fhi, top, exact,
           alo, ahi) with alo/ahi float64 arrays of one row's elements or None
   consts: (F, f_step, f_ep, f_flags, L, S, lane_cap, FIRST, LAST, TERMINATED, TRUNCATED)
   hands: per lane, what handing its full shard over touches (``Plan.hands``), or None */
static int Plan_init(Plan *self, PyObject *args, PyObject *kw) {
    PyObject *arrays, *fields, *writers, *curs, *hands;
    Py_ssize_t F, fs, fe, ff, L, S, cap;
    int f1, f2, f3, f4;
    if (!PyArg_ParseTuple(args, "O!O!(nnnnnnniiii)O!O!O!", &PyTuple_Type, &arrays,
                          &PyTuple_Type, &fields, &F, &fs, &fe, &ff, &L, &S, &cap, &f1, &f2,
                          &f3, &f4, &PyTuple_Type, &writers, &PyList_Type, &curs,
                          &PyTuple_Type, &hands))
        return -1;
    if (PyTuple_GET_SIZE(arrays) != 14 || PyTuple_GET_SIZE(fields) != NV || L <= 0 ||
        S < 2 || F <= 0 || PyTuple_GET_SIZE(writers) != L || PyList_GET_SIZE(curs) != L ||
        PyTuple_GET_SIZE(hands) != L) {
        PyErr_SetString(PyExc_ValueError, "StepPlan: bad arguments");
        return -1;
    }
    self->F = F, self->f_step = fs, self->f_ep = fe, self->f_flags = ff;
    self->L = L, self->S = S, self->lane_cap = cap;
    self->fl_first = (uint8_t)f1, self->fl_last = (uint8_t)f2;
    self->fl_term = (uint8_t)f3, self->fl_trunc = (uint8_t)f4;
#define A(i) PyTuple_GET_ITEM(arrays, i)
    if (!(self->base = array_ptr(A(0), NPY_INT64, F * L, "base")) ||
        !(self->n = array_ptr(A(1), NPY_INT64, L, "n")) ||
        !(self->first = array_ptr(A(2), NPY_INT64, L, "first")) ||
        !(self->pub = array_ptr(A(3), NPY_INT64, L, "pub")) ||
        !(self->open_step = array_ptr(A(4), NPY_INT64, L, "open_step")) ||
        !(self->count = array_ptr(A(5), NPY_INT64, L, "count")) ||
        !(self->held_ok = array_ptr(A(6), NPY_BOOL, L, "held_ok")) ||
        !(self->held = array_ptr(A(7), NPY_UINT8, L, "held")) ||
        !(self->ep_idx = array_ptr(A(8), NPY_INT32, L * cap, "episode_step")) ||
        !(self->flags_idx = array_ptr(A(9), NPY_UINT8, L * cap, "flags")) ||
        !(self->entered = array_ptr(A(10), NPY_UINT8, L, "entered")) ||
        !(self->valid_from = array_ptr(A(11), NPY_INT64, L, "valid_from")) ||
        !(self->committed = array_ptr(A(12), NPY_INT64, L, "committed")) ||
        !(self->rec = array_ptr(A(13), NPY_INT64, L, "rec")))
        return -1;
    self->held_bytes = PyArray_SIZE((PyArrayObject *)A(7)) / L;
#undef A
    for (int k = 0; k < NV; k++) {
        PyObject *t = PyTuple_GET_ITEM(fields, k), *shape, *alo, *ahi;
        vfield *vf = &self->v[k];
        int kind;
        if (!PyArg_ParseTuple(t, "iiCiO!niLLddddOO", &vf->field, &vf->type_num, &kind,
                              &vf->itemsize, &PyTuple_Type, &shape, &vf->stack, &vf->finite,
                              &vf->ilo, &vf->ihi, &vf->flo, &vf->fhi, &vf->top, &vf->exact,
                              &alo, &ahi))
            return -1;
        vf->kind = (char)kind;
        vf->ndim = (int)PyTuple_GET_SIZE(shape);
        if (vf->ndim > MAX_DIMS || vf->field < 0 || vf->field >= F) {
            PyErr_SetString(PyExc_ValueError, "StepPlan: bad field");
            return -1;
        }
        vf->elems = 1;
        for (int d = 0; d < vf->ndim; d++) {
            vf->shape[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
            if (vf->shape[d] < 0) return -1;
            vf->elems *= vf->shape[d];
        }
        vf->row_bytes = vf->elems * vf->itemsize;
        vf->alo = alo == Py_None ? NULL : array_ptr(alo, NPY_DOUBLE, vf->elems, "low");
        vf->ahi = ahi == Py_None ? NULL : array_ptr(ahi, NPY_DOUBLE, vf->elems, "high");
        if ((alo != Py_None && !vf->alo) || (ahi != Py_None && !vf->ahi)) return -1;
    }
    if (self->v[V_OBS].row_bytes != self->held_bytes) {
        PyErr_SetString(PyExc_ValueError, "StepPlan: held rows must be obs rows");
        return -1;
    }
    Py_XSETREF(self->keep, PyTuple_Pack(2, arrays, fields));
    PyObject *pending = PyTuple_New(L);
    if (pending == NULL) return -1;
    for (Py_ssize_t j = 0; j < L; j++) {
        PyObject *w = PyTuple_GET_ITEM(writers, j), *p;
        if (w == Py_None) {
            p = Py_None;
            Py_INCREF(p);
        } else if ((p = PyObject_GetAttr(w, s_pending)) == NULL || !PyList_Check(p)) {
            Py_XDECREF(p);
            Py_DECREF(pending);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "StepPlan: a writer's pending is a list");
            return -1;
        }
        PyTuple_SET_ITEM(pending, j, p);
    }
    Py_XSETREF(self->pending, pending);
    Py_INCREF(writers);
    Py_XSETREF(self->writers, writers);
    Py_INCREF(curs);
    Py_XSETREF(self->curs, curs);
    for (Py_ssize_t j = 0; j < L; j++) {
        PyObject *h = PyTuple_GET_ITEM(hands, j);
        if (h != Py_None && !(PyTuple_Check(h) && PyTuple_GET_SIZE(h) == 7 &&
                              PyList_Check(PyTuple_GET_ITEM(h, 0)) &&
                              PyList_Check(PyTuple_GET_ITEM(h, 1)) &&
                              PyList_Check(PyTuple_GET_ITEM(h, 2)) &&
                              PyList_Check(PyTuple_GET_ITEM(h, 3)) &&
                              array_ptr(PyTuple_GET_ITEM(h, 4), NPY_INT64, 2, "ends") &&
                              array_ptr(PyTuple_GET_ITEM(h, 5), NPY_UINT8, 1, "sleeping") &&
                              array_ptr(PyTuple_GET_ITEM(h, 6), NPY_UINT8, 1, "gate"))) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "StepPlan: hands: (list, list, list, list, "
                                "int64[2], uint8[1], uint8[1])");
            return -1;
        }
    }
    Py_INCREF(hands);
    Py_XSETREF(self->hands, hands);
    return self->keep ? 0 : -1;
}

typedef struct {
    const uint8_t *data;
    Py_ssize_t stride;
    int type;
    uint8_t scalar[8];
} val_t;

static int set_int(PyObject *o, PyObject *name, long long x) {
    PyObject *v = PyLong_FromLongLong(x);
    if (v == NULL) return -1;
    int r = PyObject_SetAttr(o, name, v);
    Py_DECREF(v);
    return r;
}

/* The lanes j0 .. j0 + k - 1 that: (what 1) open a shard (no rows yet), (2) were written
   and hold a full shard now, (3) were left to the caller (need[i]). */
static PyObject *lane_list(Plan *self, Py_ssize_t j0, Py_ssize_t k, const uint8_t *need,
                           int what) {
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < k; i++) {
        Py_ssize_t j = j0 + i;
        int take = what == 1 ? self->n[j] == 0 && !self->entered[j]
                   : what == 2 ? !need[i] && self->n[j] == self->S
                               : need[i];
        if (!take) continue;
        PyObject *x = PyLong_FromSsize_t(j);
        if (x == NULL || PyList_Append(out, x)) {
            Py_XDECREF(x);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(x);
    }
    return out;
}

static int hand_off(Plan *self, Py_ssize_t j); /* (below) */
static int enter(Plan *self, Py_ssize_t j);

/* plan.add(lane, obs, action, reward, next_obs, terminated, truncated) */
static PyObject *Plan_add(Plan *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "add: expected 7 arguments");
        return NULL;
    }
    Py_ssize_t lane = PyLong_AsSsize_t(args[0]);
    if (lane == -1 && PyErr_Occurred()) return NULL;
    const Py_ssize_t L = self->L;
    if (L == 0 || self->writers == NULL) Py_RETURN_FALSE; /* not set up, or cleared */
    int vector = lane < 0;
    if (!vector && lane >= L) Py_RETURN_FALSE;
    Py_ssize_t lanes = vector ? L : 0; /* leading axis of the values (0: none) */
    Py_ssize_t k = vector ? L : 1, j0 = vector ? 0 : lane;
    PyObject *given[NV] = {args[1], args[2], args[3], args[5], args[6]};
    PyObject *next_o = args[4];
    val_t val[NV], nxt;
    /* 1. the values */
    for (int f = 0; f < NV; f++) {
        vfield *vf = &self->v[f];
        val_t *x = &val[f];
        if (!vector && vf->ndim == 0 && !PyArray_Check(given[f])) {
            if (!scalar_value(vf, given[f], x->scalar)) Py_RETURN_FALSE;
            x->data = x->scalar, x->stride = 0, x->type = vf->type_num;
            continue;
        }
        if (!array_value(vf, given[f], lanes, vector, &x->data, &x->stride, &x->type))
            Py_RETURN_FALSE;
        for (Py_ssize_t i = 0; i < k; i++)
            if (!row_ok(vf, x->data + i * x->stride, x->type, 1)) Py_RETURN_FALSE;
    }
    int has_next = next_o != Py_None;
    if (has_next) {
        if (!array_value(&self->v[V_OBS], next_o, lanes, vector, &nxt.data, &nxt.stride,
                         &nxt.type))
            Py_RETURN_FALSE;
        if (vector) /* checked as the step's obs (the vector path checks every lane's) */
            for (Py_ssize_t i = 0; i < k; i++)
                if (!row_ok(&self->v[V_OBS], nxt.data + i * nxt.stride, nxt.type, 1))
                    Py_RETURN_FALSE;
    } else if (vector) {
        Py_RETURN_FALSE;
    }
    /* 2. each lane: set up, no failed write waiting, continues its held next_obs */
    const vfield *vo = &self->v[V_OBS];
    int attention = 0, entering = 0;
    uint8_t need[k]; /* 0: written here, 1: left to the caller */
    uint8_t done_l[k];
    for (Py_ssize_t i = 0; i < k; i++) {
        Py_ssize_t j = j0 + i;
        PyObject *pending = PyTuple_GET_ITEM(self->pending, j);
        if (pending == Py_None || self->base[j] == 0) Py_RETURN_FALSE;
        if (PyList_GET_SIZE(pending) != 0) Py_RETURN_FALSE; /* retried by the writer first */
        const uint8_t *o = val[V_OBS].data + i * val[V_OBS].stride;
        if (self->held_ok[j]) {
            if (val[V_OBS].type != vo->type_num) Py_RETURN_FALSE; /* (compared after a cast) */
            if (memcmp(o, self->held + j * self->held_bytes, (size_t)self->held_bytes))
                Py_RETURN_FALSE;
        }
        int done = val[V_TERM].data[i * val[V_TERM].stride] != 0 ||
                   val[V_TRUNC].data[i * val[V_TRUNC].stride] != 0;
        done_l[i] = (uint8_t)done;
        if (done) {
            if (!has_next) Py_RETURN_FALSE;
            if (!vector && !row_ok(vo, nxt.data, nxt.type, 1)) Py_RETURN_FALSE;
        }
        if (!vector && has_next && nxt.type != vo->type_num) Py_RETURN_FALSE;
        int64_t r = 1 + done;
        need[i] = self->n[j] + r > self->S; /* the final row would open the next shard */
        if (need[i]) {
            if (!vector) Py_RETURN_FALSE;
            attention = 1;
        }
        if (self->n[j] == 0 && !self->entered[j]) { /* its next row opens a shard */
            int e = enter(self, j);
            if (e < 0) return NULL;
            if (e == 0) entering = 1; /* (the caller opens it) */
        }
    }
    if (entering) { /* nothing written: the caller opens these lanes' shards, calls again */
        PyObject *lanes_o = lane_list(self, j0, k, NULL, 1);
        if (lanes_o == NULL) return NULL;
        PyObject *out = Py_BuildValue("(iN)", 1, lanes_o);
        return out;
    }
    /* the lane whose row is staged last: the last final row's, else the last lane's */
    self->last_lane = j0 + k - 1;
    if (vector)
        for (Py_ssize_t i = k - 1; i >= 0; i--)
            if (done_l[i]) {
                self->last_lane = i;
                break;
            }
    /* 3. rows, index entries, held next_obs */
    const Py_ssize_t cap = self->lane_cap;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (need[i]) continue;
        Py_ssize_t j = j0 + i;
        int64_t nrow = self->n[j], step = self->first[j] + nrow;
        int64_t ep = self->open_step[j];
        int term = val[V_TERM].data[i * val[V_TERM].stride] != 0;
        int trunc = val[V_TRUNC].data[i * val[V_TRUNC].stride] != 0;
        uint8_t flag = (uint8_t)((ep == 0 ? self->fl_first : 0) | (term ? self->fl_term : 0) |
                                 (trunc ? self->fl_trunc : 0));
        for (int f = 0; f < NV; f++) {
            const vfield *vf = &self->v[f];
            uint8_t *dst = (uint8_t *)(intptr_t)self->base[vf->field * L + j] +
                           nrow * vf->row_bytes;
            put_row(vf, val[f].data + i * val[f].stride, val[f].type, dst);
        }
        int32_t ep32 = (int32_t)ep;
        memcpy((uint8_t *)(intptr_t)self->base[self->f_step * L + j] + nrow * 8, &step, 8);
        memcpy((uint8_t *)(intptr_t)self->base[self->f_ep * L + j] + nrow * 4, &ep32, 4);
        ((uint8_t *)(intptr_t)self->base[self->f_flags * L + j])[nrow] = flag;
        Py_ssize_t row = j * cap + step % cap;
        self->ep_idx[row] = ep32;
        self->flags_idx[row] = flag;
        if (done_l[i]) { /* the final row: the final observation, zeros elsewhere */
            int64_t fstep = step + 1, frow_n = nrow + 1;
            for (int f = 0; f < NV; f++) {
                const vfield *vf = &self->v[f];
                uint8_t *dst = (uint8_t *)(intptr_t)self->base[vf->field * L + j] +
                               frow_n * vf->row_bytes;
                if (f == V_OBS) put_row(vf, nxt.data + i * nxt.stride, nxt.type, dst);
                else memset(dst, 0, (size_t)vf->row_bytes);
            }
            int32_t fep = ep32 + 1;
            memcpy((uint8_t *)(intptr_t)self->base[self->f_step * L + j] + frow_n * 8, &fstep,
                   8);
            memcpy((uint8_t *)(intptr_t)self->base[self->f_ep * L + j] + frow_n * 4, &fep, 4);
            ((uint8_t *)(intptr_t)self->base[self->f_flags * L + j])[frow_n] = self->fl_last;
            Py_ssize_t frow = j * cap + fstep % cap;
            self->ep_idx[frow] = fep;
            self->flags_idx[frow] = self->fl_last;
            self->open_step[j] = 0;
            self->held_ok[j] = 0;
        } else {
            self->open_step[j] = ep + 1;
            if (has_next) {
                put_row(vo, nxt.data + i * nxt.stride, nxt.type,
                        self->held + j * self->held_bytes);
                self->held_ok[j] = 1;
            } else {
                self->held_ok[j] = 0;
            }
        }
        int64_t top = step + 1 + done_l[i];
        if (self->count[j] < top) self->count[j] = top;
    }
    /* 4. the rows first, then their counts: a reader that sees a count sees its rows */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    for (Py_ssize_t i = 0; i < k; i++) {
        if (need[i]) continue;
        Py_ssize_t j = j0 + i;
        self->n[j] += 1 + done_l[i];
        if (self->pub[j])
            __atomic_store_n((int64_t *)(intptr_t)self->pub[j], self->n[j], __ATOMIC_RELEASE);
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        if (need[i]) continue;
        Py_ssize_t j = j0 + i;
        PyObject *w = PyTuple_GET_ITEM(self->writers, j);
        if (self->rec[j]) ((int64_t *)(intptr_t)self->rec[j])[R_N] = self->n[j];
        else if (set_int(PyList_GET_ITEM(self->curs, j), s_n, self->n[j])) return NULL;
        if (set_int(w, s_count, self->first[j] + self->n[j])) return NULL;
        if (done_l[i]) {
            PyObject *e = PyObject_GetAttr(w, s_episodes);
            if (e == NULL) return NULL;
            long long ne = PyLong_AsLongLong(e);
            Py_DECREF(e);
            if ((ne == -1 && PyErr_Occurred()) || set_int(w, s_episodes, ne + 1)) return NULL;
        }
    }
    int full = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (need[i] || self->n[j0 + i] != self->S) continue;
        int h = hand_off(self, j0 + i);
        if (h < 0) return NULL;
        if (h == 0) full = 1; /* (the caller hands it over) */
    }
    if (!attention && !full) Py_RETURN_NONE;
    PyObject *full_o = lane_list(self, j0, k, need, 2);
    PyObject *left_o = full_o ? lane_list(self, j0, k, need, 3) : NULL;
    if (left_o == NULL) {
        Py_XDECREF(full_o);
        return NULL;
    }
    return Py_BuildValue("(iNN)", 2, full_o, left_o);
}

#include "step_shards.h"

/* addresses(arrays, out): out[i] = the data address of numpy array arrays[i] (a few
   nanoseconds each, where ``arr.ctypes.data`` takes microseconds) */
static PyObject *addresses(PyObject *self, PyObject *args) {
    PyObject *seq, *out;
    if (!PyArg_ParseTuple(args, "O!O", &PyTuple_Type, &seq, &out)) return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(seq);
    int64_t *dst = array_ptr(out, NPY_INT64, k, "out");
    if (dst == NULL) return NULL;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *a = PyTuple_GET_ITEM(seq, i);
        if (!PyArray_Check(a)) {
            PyErr_SetString(PyExc_TypeError, "addresses: expected numpy arrays");
            return NULL;
        }
        dst[i] = (int64_t)(intptr_t)PyArray_DATA((PyArrayObject *)a);
    }
    Py_RETURN_NONE;
}

/* same_bytes(a, b): whether two C-contiguous buffers hold the same bytes (one memcmp, where
   ``a.tobytes() == b.tobytes()`` copies both) */
static PyObject *same_bytes(PyObject *self, PyObject *args) {
    PyObject *a, *b;
    if (!PyArg_ParseTuple(args, "OO", &a, &b)) return NULL;
    held_buffer x = {0}, y = {0};
    PyObject *result = NULL;
    if (!take(a, &x, 0, 0, "a") && !take(b, &y, 0, 0, "b"))
        result = PyBool_FromLong(x.view.len == y.view.len &&
                                 memcmp(x.view.buf, y.view.buf, (size_t)x.view.len) == 0);
    release(&x);
    release(&y);
    return result;
}

/* copy_bytes(dst, src): memcpy of one C-contiguous buffer into another of the same size,
   holding the GIL (numpy releases it for copies this size, and a background thread that
   takes it then keeps the adding thread waiting for up to the switch interval) */
static PyObject *copy_bytes(PyObject *self, PyObject *args) {
    PyObject *a, *b;
    if (!PyArg_ParseTuple(args, "OO", &a, &b)) return NULL;
    held_buffer dst = {0}, src = {0};
    PyObject *result = NULL;
    if (!take(a, &dst, 0, 1, "dst") && !take(b, &src, 0, 0, "src")) {
        if (dst.view.len == src.view.len) {
            memmove(dst.view.buf, src.view.buf, (size_t)src.view.len);
            result = Py_None;
            Py_INCREF(result);
        } else {
            PyErr_SetString(PyExc_ValueError, "copy_bytes: buffers of different sizes");
        }
    }
    release(&dst);
    release(&src);
    return result;
}

static PyMethodDef module_methods[] = {
    {"addresses", addresses, METH_VARARGS, "addresses(arrays, out): data addresses"},
    {"same_bytes", same_bytes, METH_VARARGS,
     "same_bytes(a, b): whether two C-contiguous buffers hold the same bytes"},
    {"copy_bytes", copy_bytes, METH_VARARGS,
     "copy_bytes(dst, src): copy a C-contiguous buffer into one of the same size (GIL held)"},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef Plan_methods[] = {
    {"add", (PyCFunction)(void (*)(void))Plan_add, METH_FASTCALL,
     "add(lane, obs, action, reward, next_obs, terminated, truncated): stage one step "
     "(lane -1: one per lane); None: written, False: nothing written (general path), a "
     "list: lanes left to the caller, the others written."},
    {"load", (PyCFunction)Plan_load, METH_O,
     "load(lane): re-read the lane's open shard and index bounds after its writer moved"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Plan_members[] = {
    {"last_lane", T_PYSSIZET, offsetof(Plan, last_lane), READONLY,
     "the lane the index received rows in last (after a call that wrote)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "expstore.storage.native._step.StepPlan",
    .tp_basicsize = sizeof(Plan),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Plan_traverse,
    .tp_clear = (inquiry)Plan_clear,
    .tp_doc = "Addresses of a store's write path, for one C call per env step.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_methods = Plan_methods,
    .tp_members = Plan_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_step",
    "The write side: one env step staged with one C call (StepPlan), and the writer's batch "
    "kernels (stage_lanes, encode_rows: _write.c).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__step(void) {
    import_array();
    if (PyType_Ready(&PlanType) < 0) return NULL;
    s_pending = PyUnicode_InternFromString("pending");
    s_n = PyUnicode_InternFromString("n");
    s_count = PyUnicode_InternFromString("count");
    s_episodes = PyUnicode_InternFromString("episodes");
    s_cur = PyUnicode_InternFromString("cur");
    s_rec_at = PyUnicode_InternFromString("rec_at");
    s_valid_from = PyUnicode_InternFromString("valid_from");
    s_committed = PyUnicode_InternFromString("committed");
    if (!s_pending || !s_n || !s_count || !s_episodes || !s_cur || !s_rec_at ||
        !s_valid_from || !s_committed)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    write_kernels_init();
    if (PyModule_AddFunctions(m, write_kernel_methods) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *record = Py_BuildValue("(iiiiiii)", R_N, R_FIRST, R_ENTERED, R_CLEAN, R_DONE,
                                     R_SLOT, R_ADDRESSES);
    if (record == NULL || PyModule_AddObject(m, "RECORD", record) < 0) {
        Py_XDECREF(record);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "StepPlan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
