/*
 * expstore.index._rows: the row index's per-sample questions for a whole batch in one call.
 *
 * A sampler asks the in-RAM index three things per batch: which drawn rows can start a
 * transition (``RowIndex.valid``), where uniform draws land (``uniform_rows``), and the
 * frame-stack windows and n-step horizon of each anchor (``make_plan``). In numpy each is
 * a dozen small array operations (~90 us for a batch of 32); here each is one loop over
 * the rows. Same answers as the numpy code in ``rows.py`` / ``windows.py`` (tests compare
 * them), which stays the path where this module was not built.
 *
 *   valid(rows, count, lower, upper, flags, episode_step, L, history, horizon, bits, ok)
 *   uniform(draws, count, lower, upper, flags, episode_step, L, history, horizon, bits,
 *           out, filled) -> filled
 *   windows(rows, count, upper, flags, episode_step, L, k, n_step, bits, steps, m,
 *           obs_rows, obs_pad, obs_steps, next_rows, next_pad, next_steps,
 *           valid_from, guard, history, ok)
 *
 * Index arrays: ``count`` / ``lower`` / ``upper`` int64 per lane (rows visible, oldest step
 * a sample may touch, one past the newest readable step); ``flags`` uint8 and
 * ``episode_step`` int32 per row; ``L`` rows per lane; ``bits`` = (NO_ANCHOR, FIRST, LAST).
 * ``valid`` and ``windows`` answer None (and write nothing) where a row is outside the
 * index: the caller's numpy path then decides what such rows mean.
 *
 * ``windows`` also says, in ``ok``, which anchors are ``valid`` (``history``, horizon
 * ``n_step``, the lower bound ``max(valid_from, count - L + guard)``) for the very steps it
 * derived, in the same call: another thread of the process may add rows between a
 * sampler's draw and its plan (the draw's bound taken before ``rng`` released the GIL),
 * and a drawn row may by then hold a later step, a final row or one whose next step is not
 * written. The call holds the GIL throughout, and the writer changes the index only under
 * it, so the plan and its ``ok`` describe one state.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "buffers.h" /* held_buffer, take_ints, release */

static inline int64_t floor_mod(int64_t a, int64_t L) {
    int64_t r = a % L;
    return r < 0 ? r + L : r;
}

/* what every call shares: the index and the need */
typedef struct {
    const int64_t *count, *lower, *upper;
    const uint8_t *flags;
    const int32_t *episode_step;
    int64_t L, lanes, capacity;
    uint8_t no_anchor, first, last;
} index_t;

/* step id of ``row`` (-1: its slot was never written); ``RowIndex.steps`` */
static inline int64_t step_of(const index_t *x, int64_t row) {
    int64_t lane = row / x->L, slot = row - lane * x->L, c = x->count[lane];
    return c > slot ? c - 1 - (c - 1 - slot) % x->L : -1;
}

/* steps available ahead of ``row`` (at step ``s``), up to ``n``: ``RowIndex.horizon``'s m */
static inline int64_t horizon_of(const index_t *x, int64_t row, int64_t s, int64_t n) {
    if (s < 0) return 0;
    int64_t lane = row / x->L, base = lane * x->L, cnt = x->upper[lane], m = 0;
    for (int64_t j = 1; j <= n; j++) {
        int64_t sj = s + j;
        uint8_t f = x->flags[base + floor_mod(sj, x->L)];
        if (sj >= cnt || (f & x->first)) return 0;
        m = j;
        if (f & x->last) break;
    }
    return m;
}

/* ``RowIndex.valid`` of one row */
static inline int valid_row(const index_t *x, int64_t row, int64_t history, int64_t horizon) {
    int64_t s = step_of(x, row);
    if ((x->flags[row] & x->no_anchor) || s < 0) return 0;
    int64_t lo = x->lower[row / x->L], back = 0;
    if (history) {
        back = x->episode_step[row];
        if (back > history) back = history;
    }
    if (s - back < lo) return 0;
    return horizon_of(x, row, s, horizon) > 0;
}

static int load_index(index_t *x, held_buffer *b, PyObject **objs, int64_t L, int need_lower,
                      int need_upper, PyObject *bits) {
    /* objs: count, lower, upper, flags, episode_step (lower / upper may be unused: None) */
    static const char *names[] = {"count", "lower", "upper", "flags", "episode_step"};
    static const Py_ssize_t sizes[] = {8, 8, 8, 1, 4};
    for (int i = 0; i < 5; i++) {
        if ((i == 1 && !need_lower) || (i == 2 && !need_upper)) continue;
        if (take_ints(objs[i], &b[i], sizes[i], 0, names[i])) return -1;
    }
    if (L <= 0) {
        PyErr_SetString(PyExc_ValueError, "lane_capacity: expected > 0");
        return -1;
    }
    x->L = L;
    x->lanes = b[0].view.len / 8;
    x->capacity = b[3].view.len;
    if (x->capacity != x->lanes * L || b[4].view.len / 4 != x->capacity ||
        (need_lower && b[1].view.len / 8 != x->lanes) ||
        (need_upper && b[2].view.len / 8 != x->lanes)) {
        PyErr_SetString(PyExc_ValueError, "index arrays: expected count/lower/upper of one "
                                          "entry per lane and flags/episode_step of L per lane");
        return -1;
    }
    x->count = b[0].view.buf;
    x->lower = need_lower ? b[1].view.buf : NULL;
    x->upper = need_upper ? b[2].view.buf : NULL;
    x->flags = b[3].view.buf;
    x->episode_step = b[4].view.buf;
    int no_anchor, first, last;
    if (!PyArg_ParseTuple(bits, "iii", &no_anchor, &first, &last)) return -1;
    x->no_anchor = (uint8_t)no_anchor, x->first = (uint8_t)first, x->last = (uint8_t)last;
    return 0;
}

static int in_index(const index_t *x, const int64_t *rows, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= x->capacity) return 0;
    return 1;
}

static PyObject *py_valid(PyObject *self, PyObject *args) {
    PyObject *rows_o, *ok_o, *bits, *o[5];
    long long L, history, horizon;
    if (!PyArg_ParseTuple(args, "OOOOOOLLLOO", &rows_o, &o[0], &o[1], &o[2], &o[3], &o[4], &L,
                          &history, &horizon, &bits, &ok_o))
        return NULL;
    held_buffer b[5], rb = {0}, ob = {0};
    memset(b, 0, sizeof b);
    index_t x;
    PyObject *result = NULL;
    if (load_index(&x, b, o, L, 1, 1, bits) || take_ints(rows_o, &rb, 8, 0, "rows") ||
        take_ints(ok_o, &ob, 1, 1, "ok"))
        goto done;
    Py_ssize_t n = rb.view.len / 8;
    if (ob.view.len != n) {
        PyErr_SetString(PyExc_ValueError, "ok: expected one entry per row");
        goto done;
    }
    const int64_t *rows = rb.view.buf;
    if (!in_index(&x, rows, n)) {
        result = Py_None;
        goto done;
    }
    uint8_t *ok = ob.view.buf;
    for (Py_ssize_t i = 0; i < n; i++) ok[i] = (uint8_t)valid_row(&x, rows[i], history, horizon);
    result = Py_True;
done:
    for (int i = 0; i < 5; i++) release(&b[i]);
    release(&rb), release(&ob);
    Py_XINCREF(result);
    return result;
}

static PyObject *py_uniform(PyObject *self, PyObject *args) {
    PyObject *draws_o, *out_o, *bits, *o[5];
    long long L, history, horizon;
    Py_ssize_t filled;
    if (!PyArg_ParseTuple(args, "OOOOOOLLLOOn", &draws_o, &o[0], &o[1], &o[2], &o[3], &o[4],
                          &L, &history, &horizon, &bits, &out_o, &filled))
        return NULL;
    held_buffer b[5], db = {0}, ob = {0};
    memset(b, 0, sizeof b);
    index_t x;
    int64_t *bounds = NULL;
    PyObject *result = NULL;
    if (load_index(&x, b, o, L, 1, 1, bits) || take_ints(draws_o, &db, 8, 0, "draws") ||
        take_ints(out_o, &ob, 8, 1, "out"))
        goto done;
    Py_ssize_t n = db.view.len / 8, room = ob.view.len / 8;
    if (filled < 0 || filled > room) {
        PyErr_SetString(PyExc_ValueError, "filled: expected 0 .. len(out)");
        goto done;
    }
    if (!(bounds = PyMem_Malloc(sizeof(int64_t) * (size_t)(x.lanes ? x.lanes : 1)))) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t total = 0;
    for (int64_t l = 0; l < x.lanes; l++) {
        int64_t p = x.upper[l] - x.lower[l];
        total += p > 0 ? p : 0;
        bounds[l] = total; /* rows of lanes 0..l */
    }
    const int64_t *draws = db.view.buf;
    int64_t *out = ob.view.buf;
    for (Py_ssize_t i = 0; i < n && filled < room; i++) {
        int64_t k = draws[i];
        if (k < 0 || k >= total) {
            PyErr_Format(PyExc_ValueError, "draws: expected 0 .. %lld, got %lld",
                         (long long)total - 1, (long long)k);
            goto done;
        }
        int64_t lo = 0, hi = x.lanes - 1; /* first lane whose bounds exceed k */
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (bounds[mid] > k) hi = mid;
            else lo = mid + 1;
        }
        int64_t before = lo ? bounds[lo - 1] : 0;
        int64_t row = lo * x.L + floor_mod(x.lower[lo] + (k - before), x.L);
        if (valid_row(&x, row, history, horizon)) out[filled++] = row;
    }
    result = PyLong_FromSsize_t(filled);
done:
    PyMem_Free(bounds);
    for (int i = 0; i < 5; i++) release(&b[i]);
    release(&db), release(&ob);
    return result;
}

/* one frame stack of ``k`` rows ending at ``row`` (step ``s``), clamped at its episode's
   first row: ``stack_rows`` for one sample */
static inline void stack_of(const index_t *x, int64_t row, int64_t s, int64_t k, int64_t *rows,
                            uint8_t *pad, int64_t *steps) {
    if (k == 1) {
        rows[0] = row, pad[0] = 0, steps[0] = s;
        return;
    }
    int64_t pos = x->episode_step[row], lane = row / x->L, slot = row - lane * x->L;
    for (int64_t c = 0; c < k; c++) {
        int64_t back = k - 1 - c, shift = back < pos ? back : pos;
        pad[c] = back > pos;
        rows[c] = lane * x->L + floor_mod(slot - shift, x->L);
        steps[c] = s - shift;
    }
}

static PyObject *py_windows(PyObject *self, PyObject *args) {
    PyObject *rows_o, *bits, *o[5], *outs[8], *vf_o, *ok_o;
    long long L, k, n_step, guard, history;
    if (!PyArg_ParseTuple(args, "OOOOOLLLOOOOOOOOOOLLO", &rows_o, &o[0], &o[2], &o[3], &o[4],
                          &L, &k, &n_step, &bits, &outs[0], &outs[1], &outs[2], &outs[3],
                          &outs[4], &outs[5], &outs[6], &outs[7], &vf_o, &guard, &history,
                          &ok_o))
        return NULL;
    static const char *names[] = {"steps", "m", "obs_rows", "obs_pad", "obs_steps",
                                  "next_rows", "next_pad", "next_steps"};
    static const Py_ssize_t sizes[] = {8, 8, 8, 1, 8, 8, 1, 8};
    held_buffer b[5], rb = {0}, ob[8], vb = {0}, okb = {0};
    memset(b, 0, sizeof b);
    memset(ob, 0, sizeof ob);
    index_t x;
    int64_t *lower = NULL;
    PyObject *result = NULL;
    o[1] = Py_None;
    if (load_index(&x, b, o, L, 0, 1, bits) || take_ints(rows_o, &rb, 8, 0, "rows") ||
        take_ints(vf_o, &vb, 8, 0, "valid_from") || take_ints(ok_o, &okb, 1, 1, "ok"))
        goto done;
    Py_ssize_t n = rb.view.len / 8;
    if (k < 1 || n_step < 1 || guard < 0 || history < 0) {
        PyErr_SetString(PyExc_ValueError, "k and n_step: expected >= 1, guard and history >= 0");
        goto done;
    }
    if (vb.view.len / 8 != x.lanes || okb.view.len != n) {
        PyErr_SetString(PyExc_ValueError, "valid_from: one entry per lane, ok: one per row");
        goto done;
    }
    for (int i = 0; i < 8; i++) {
        if (take_ints(outs[i], &ob[i], sizes[i], 1, names[i])) goto done;
        if (ob[i].view.len / sizes[i] != n * (i < 2 ? 1 : k)) {
            PyErr_Format(PyExc_ValueError, "%s: expected %zd entries", names[i],
                         n * (i < 2 ? 1 : (Py_ssize_t)k));
            goto done;
        }
    }
    const int64_t *rows = rb.view.buf;
    if (!in_index(&x, rows, n)) {
        result = Py_None;
        goto done;
    }
    if (!(lower = PyMem_Malloc(sizeof(int64_t) * (size_t)(x.lanes ? x.lanes : 1)))) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *vf = vb.view.buf;
    for (int64_t l = 0; l < x.lanes; l++) { /* RowIndex.lower_bound(guard) */
        int64_t lo = x.count[l] - x.L + guard;
        lower[l] = vf[l] > lo ? vf[l] : lo;
    }
    x.lower = lower;
    int64_t *steps = ob[0].view.buf, *m = ob[1].view.buf;
    uint8_t *ok = okb.view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t row = rows[i], s = step_of(&x, row), h = horizon_of(&x, row, s, n_step);
        int64_t lane = row / x.L, end = lane * x.L + floor_mod(s + h, x.L);
        steps[i] = s, m[i] = h;
        ok[i] = (uint8_t)(h > 0 && valid_row(&x, row, history, 1)); /* (valid, horizon n_step) */
        stack_of(&x, row, s, k, (int64_t *)ob[2].view.buf + i * k,
                 (uint8_t *)ob[3].view.buf + i * k, (int64_t *)ob[4].view.buf + i * k);
        stack_of(&x, end, s + h, k, (int64_t *)ob[5].view.buf + i * k,
                 (uint8_t *)ob[6].view.buf + i * k, (int64_t *)ob[7].view.buf + i * k);
    }
    result = Py_True;
done:
    PyMem_Free(lower);
    for (int i = 0; i < 5; i++) release(&b[i]);
    for (int i = 0; i < 8; i++) release(&ob[i]);
    release(&rb), release(&vb), release(&okb);
    Py_XINCREF(result);
    return result;
}

static PyMethodDef methods[] = {
    {"valid", py_valid, METH_VARARGS, "Which rows can start a transition (RowIndex.valid)."},
    {"uniform", py_uniform, METH_VARARGS,
     "Uniform draws -> rows, the valid ones appended to out; the new fill."},
    {"windows", py_windows, METH_VARARGS,
     "Steps, horizons and frame-stack windows of anchor rows (make_plan)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows", NULL, -1, methods};

PyMODINIT_FUNC PyInit__rows(void) { return PyModule_Create(&module); }
