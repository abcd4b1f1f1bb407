/*
 * The write side's batch kernels, part of the ``expstore.storage.native._step`` extension
 * (its other source, ``_step.c``, stages one env step; this file needs no numpy). Run by
 * the writer, never by a reader:
 *
 *   encode_rows(fn, src, n, row_bytes, typesize, clevel, shuffle, cname, blocksize, checksum)
 *       encode many rows, one blosc frame each (numcodecs' own
 *       blosc_compress_ctx, passed by address), crc32c appended, in one call without the
 *       GIL, so a background writer does not take the GIL from the env loop per frame.
 *
 *   stage_lanes(srcs, lanes, base, n, first, pub, row_bytes, step_field, steps, full)
 *       one env step of every lane of a vector env into each lane's
 *       staging buffer, one memcpy per lane and field, then each lane's published count.
 *
 *   step_rows(srcs, nexts, dsts, term, trunc, ends, ep, flags, open_step)
 *       the rows of a batch of consecutive steps of one lane with final rows between them
 *       (``rows.encode_steps``, the row model, held to it by ``tests/test_encode_steps.py``):
 *       one memcpy per field and run of steps where numpy took a dozen calls per field.
 *
 *   replace_files(tmps, paths, bufs, fsync)
 *       a shard's objects on local disk (one file per field) each written to a temp file,
 *       synced and renamed over its object, in one call without the GIL: a writing thread
 *       that took the GIL back after each of those ~40 system calls cost a Python caller
 *       beside it more than the writes themselves (docs/architecture.md §4).
 *
 * Registered on the module by ``PyInit__step`` through ``write_kernels.h``.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "buffers.h" /* held_buffer, take, release */
#include "crc32c.h"  /* crc_init, crc32c */
#include "write_kernels.h"

/* stage_lanes(srcs, lanes, base, n, first, pub, row_bytes, step_field, steps, full)
   One row in each lane of `lanes` (int64, k distinct lanes): field f's row i (srcs[f], k
   rows of row_bytes[f] bytes; None for the step-id field `step_field`) goes to address
   base[f, lane] + n[lane] * row_bytes[f] (base: int64 (fields, L), the lane's current shard
   buffer of that field). The step id first[lane] + n[lane] is written to the step-id field
   and to steps[i]. Then, after every row, the lane's published row count (the int64 at
   address pub[lane], 0: none) becomes n[lane] + 1, and n[lane] is incremented. Returns how
   many of the lanes now hold `full` rows. The addresses are the caller's: rows of arrays it holds alive, each with room for a row. */
static PyObject *stage_lanes(PyObject *self, PyObject *args) {
    PyObject *srcs_o, *lanes_o, *base_o, *n_o, *first_o, *pub_o, *rb_o, *steps_o;
    Py_ssize_t step_field, full;
    if (!PyArg_ParseTuple(args, "OOOOOOOnOn", &srcs_o, &lanes_o, &base_o, &n_o, &first_o,
                          &pub_o, &rb_o, &step_field, &steps_o, &full))
        return NULL;
    if (!PyTuple_Check(srcs_o)) {
        PyErr_SetString(PyExc_TypeError, "stage_lanes: srcs must be a tuple");
        return NULL;
    }
    Py_ssize_t F = PyTuple_GET_SIZE(srcs_o);
    if (F > 256) {
        PyErr_SetString(PyExc_ValueError, "stage_lanes: at most 256 fields");
        return NULL;
    }
    held_buffer ln = {0}, bs = {0}, nb = {0}, fs = {0}, pb = {0}, rb = {0}, st = {0};
    held_buffer src[256];
    memset(src, 0, sizeof(src));
    PyObject *result = NULL;
    if (take(lanes_o, &ln, 8, 0, "lanes") || take(base_o, &bs, 8, 0, "base") ||
        take(n_o, &nb, 8, 1, "n") || take(first_o, &fs, 8, 0, "first") ||
        take(pub_o, &pb, 8, 0, "pub") || take(rb_o, &rb, 8, 0, "row_bytes") ||
        take(steps_o, &st, 8, 1, "steps"))
        goto done;
    Py_ssize_t k = ln.view.len / 8, L = nb.view.len / 8;
    if (rb.view.len / 8 != F || bs.view.len / 8 != F * L || fs.view.len / 8 != L ||
        pb.view.len / 8 != L || st.view.len / 8 < k || step_field < 0 || step_field >= F) {
        PyErr_SetString(PyExc_ValueError, "stage_lanes: base must be (fields, lanes), n, "
                                          "first and pub one per lane, steps one per row");
        goto done;
    }
    const int64_t *lanes = ln.view.buf, *base = bs.view.buf, *first = fs.view.buf;
    const int64_t *pub = pb.view.buf, *row_bytes = rb.view.buf;
    int64_t *n = nb.view.buf, *steps = st.view.buf;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (lanes[i] < 0 || lanes[i] >= L) {
            PyErr_Format(PyExc_IndexError, "stage_lanes: lane %lld out of range",
                         (long long)lanes[i]);
            goto done;
        }
    }
    for (Py_ssize_t f = 0; f < F; f++) {
        if (row_bytes[f] <= 0) {
            PyErr_SetString(PyExc_ValueError, "stage_lanes: row_bytes must be positive");
            goto done;
        }
        if (f == step_field) {
            if (row_bytes[f] != 8) {
                PyErr_SetString(PyExc_ValueError, "stage_lanes: step ids are int64");
                goto done;
            }
            continue;
        }
        if (take(PyTuple_GET_ITEM(srcs_o, f), &src[f], 0, 0, "src")) goto done;
        if (src[f].view.len < k * row_bytes[f]) {
            PyErr_Format(PyExc_ValueError, "stage_lanes: field %zd holds fewer than %zd rows",
                         f, k);
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        int64_t j = lanes[i];
        steps[i] = first[j] + n[j];
        for (Py_ssize_t f = 0; f < F; f++) {
            int64_t at = base[f * L + j];
            if (at == 0) {
                PyErr_Format(PyExc_ValueError, "stage_lanes: lane %lld has no buffer",
                             (long long)j);
                goto done;
            }
            uint8_t *d = (uint8_t *)(intptr_t)at + n[j] * row_bytes[f];
            if (f == step_field)
                memcpy(d, &steps[i], 8);
            else
                memcpy(d, (const uint8_t *)src[f].view.buf + i * row_bytes[f],
                       (size_t)row_bytes[f]);
        }
    }
    /* the rows first, then their counts: a reader that sees a count sees its rows */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    Py_ssize_t n_full = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        int64_t j = lanes[i];
        n[j] += 1;
        if (pub[j]) __atomic_store_n((int64_t *)(intptr_t)pub[j], n[j], __ATOMIC_RELEASE);
        if (n[j] == full) n_full++;
    }
    result = PyLong_FromSsize_t(n_full);
done:
    for (Py_ssize_t f = 0; f < F && f < 256; f++) release(&src[f]);
    release(&ln);
    release(&bs);
    release(&nb);
    release(&fs);
    release(&pb);
    release(&rb);
    release(&st);
    return result;
}

/* the row model's flags (expstore/rows.py) */
#define ROW_FIRST 1
#define ROW_LAST 2
#define ROW_TERMINATED 4
#define ROW_TRUNCATED 8

/* step_rows(srcs, nexts, dsts, term, trunc, ends, ep, flags, open_step) -> next_open
   T consecutive steps of one lane as rows, a final row after each step t with ends[t]:
   field f's step rows come from srcs[f] (T rows), its final row after step t from row t of
   nexts[f] (None: zeros), all into dsts[f] (T + finals rows, as many bytes per row). Episode
   positions (int32) into ep and flags (uint8) into flags, counting from open_step; returns
   the position of the lane's next row (0 after a final row). term, trunc, ends: T bools. */
static PyObject *step_rows(PyObject *self, PyObject *args) {
    PyObject *srcs_o, *nexts_o, *dsts_o, *term_o, *trunc_o, *ends_o, *ep_o, *flags_o;
    long long open_step;
    if (!PyArg_ParseTuple(args, "OOOOOOOOL", &srcs_o, &nexts_o, &dsts_o, &term_o, &trunc_o,
                          &ends_o, &ep_o, &flags_o, &open_step))
        return NULL;
    if (!PyTuple_Check(srcs_o) || !PyTuple_Check(nexts_o) || !PyTuple_Check(dsts_o) ||
        PyTuple_GET_SIZE(nexts_o) != PyTuple_GET_SIZE(srcs_o) ||
        PyTuple_GET_SIZE(dsts_o) != PyTuple_GET_SIZE(srcs_o)) {
        PyErr_SetString(PyExc_TypeError, "step_rows: srcs, nexts and dsts must be tuples of "
                                         "one item per field");
        return NULL;
    }
    Py_ssize_t F = PyTuple_GET_SIZE(srcs_o);
    if (F > 256) {
        PyErr_SetString(PyExc_ValueError, "step_rows: at most 256 fields");
        return NULL;
    }
    held_buffer tm = {0}, tr = {0}, en = {0}, ep = {0}, fl = {0};
    held_buffer src[256], nxt[256], dst[256];
    memset(src, 0, sizeof(src));
    memset(nxt, 0, sizeof(nxt));
    memset(dst, 0, sizeof(dst));
    Py_ssize_t rb[256];
    PyObject *result = NULL;
    if (take(term_o, &tm, 1, 0, "term") || take(trunc_o, &tr, 1, 0, "trunc") ||
        take(ends_o, &en, 1, 0, "ends") || take(ep_o, &ep, 4, 1, "ep") ||
        take(flags_o, &fl, 1, 1, "flags"))
        goto done;
    Py_ssize_t T = tm.view.len, n_rows = fl.view.len, finals = 0;
    const uint8_t *term = tm.view.buf, *trunc = tr.view.buf, *ends = en.view.buf;
    if (tr.view.len == T && en.view.len == T)
        for (Py_ssize_t t = 0; t < T; t++) finals += ends[t] != 0;
    if (tr.view.len != T || en.view.len != T || n_rows != T + finals ||
        ep.view.len != 4 * n_rows) {
        PyErr_SetString(PyExc_ValueError, "step_rows: term, trunc and ends must hold one "
                                          "bool per step, ep and flags one item per row");
        goto done;
    }
    for (Py_ssize_t f = 0; f < F; f++) {
        if (take(PyTuple_GET_ITEM(srcs_o, f), &src[f], 0, 0, "src") ||
            take(PyTuple_GET_ITEM(dsts_o, f), &dst[f], 0, 1, "dst"))
            goto done;
        rb[f] = T ? src[f].view.len / T : 0;
        PyObject *n = PyTuple_GET_ITEM(nexts_o, f);
        if ((T && src[f].view.len != rb[f] * T) || dst[f].view.len != rb[f] * n_rows ||
            (n != Py_None && (take(n, &nxt[f], 0, 0, "next") || nxt[f].view.len != rb[f] * T))) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "step_rows: field %zd: src and next must hold "
                             "T rows and dst T + finals rows of one size", f);
            goto done;
        }
    }
    int32_t *eps = ep.view.buf;
    uint8_t *flags = fl.view.buf;
    int64_t e = open_step;
    Py_ssize_t r = 0, run = 0; /* next row; first step of the run not yet copied */
    for (Py_ssize_t t = 0; t < T; t++) {
        eps[r] = (int32_t)e;
        flags[r] = (uint8_t)((e == 0 ? ROW_FIRST : 0) | (term[t] ? ROW_TERMINATED : 0) |
                             (trunc[t] ? ROW_TRUNCATED : 0));
        r++, e++;
        if (!ends[t]) continue;
        /* steps run..t go to rows r - 1 - (t - run) .. r - 1, then the final row r */
        for (Py_ssize_t f = 0; f < F; f++) {
            uint8_t *d = (uint8_t *)dst[f].view.buf;
            const uint8_t *s = (const uint8_t *)src[f].view.buf;
            memcpy(d + (r - 1 - (t - run)) * rb[f], s + run * rb[f], (size_t)((t + 1 - run) * rb[f]));
            if (nxt[f].held)
                memcpy(d + r * rb[f], (const uint8_t *)nxt[f].view.buf + t * rb[f], (size_t)rb[f]);
            else
                memset(d + r * rb[f], 0, (size_t)rb[f]);
        }
        eps[r] = (int32_t)e;
        flags[r] = (uint8_t)(ROW_LAST | (e == 0 ? ROW_FIRST : 0));
        r++, e = 0, run = t + 1;
    }
    for (Py_ssize_t f = 0; f < F && run < T; f++)
        memcpy((uint8_t *)dst[f].view.buf + (r - (T - run)) * rb[f],
               (const uint8_t *)src[f].view.buf + run * rb[f], (size_t)((T - run) * rb[f]));
    result = PyLong_FromLongLong(e);
done:
    for (Py_ssize_t f = 0; f < F && f < 256; f++) {
        release(&src[f]);
        release(&nxt[f]);
        release(&dst[f]);
    }
    release(&tm);
    release(&tr);
    release(&en);
    release(&ep);
    release(&fl);
    return result;
}

/* numcodecs' blosc_compress_ctx (the function numcodecs.blosc.compress calls): its address
   comes from the caller, so the frames are byte for byte what numcodecs would write. */
typedef int (*blosc_compress_ctx_fn)(int clevel, int doshuffle, size_t typesize,
                                     size_t nbytes, const void *src, void *dest,
                                     size_t destsize, const char *compressor,
                                     size_t blocksize, int numinternalthreads);

#define BLOSC_MAX_OVERHEAD 16

static PyObject *encode_rows(PyObject *self, PyObject *args) {
    unsigned long long fn_addr;
    PyObject *src_o;
    Py_ssize_t n, row_bytes, typesize, blocksize;
    int clevel, shuffle, checksum;
    const char *cname;
    if (!PyArg_ParseTuple(args, "KOnnniisnp", &fn_addr, &src_o, &n, &row_bytes, &typesize,
                          &clevel, &shuffle, &cname, &blocksize, &checksum))
        return NULL;
    held_buffer src = {0};
    PyObject *blob = NULL, *sizes = NULL, *result = NULL;
    if (take(src_o, &src, 0, 0, "src")) goto done;
    if (n < 0 || row_bytes <= 0 || typesize <= 0 || src.view.len < n * row_bytes ||
        fn_addr == 0) {
        PyErr_SetString(PyExc_ValueError, "encode_rows: bad arguments");
        goto done;
    }
    Py_ssize_t each = row_bytes + BLOSC_MAX_OVERHEAD + 4;
    blob = PyBytes_FromStringAndSize(NULL, n * each);
    sizes = PyBytes_FromStringAndSize(NULL, n * 8);
    if (blob == NULL || sizes == NULL) goto done;
    blosc_compress_ctx_fn fn = (blosc_compress_ctx_fn)(uintptr_t)fn_addr;
    const uint8_t *in = src.view.buf;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(blob);
    int64_t *sz = (int64_t *)PyBytes_AS_STRING(sizes);
    Py_ssize_t at = 0, failed = -1;
    int code = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int k = fn(clevel, shuffle, (size_t)typesize, (size_t)row_bytes, in + i * row_bytes,
                   out + at, (size_t)(row_bytes + BLOSC_MAX_OVERHEAD), cname,
                   (size_t)blocksize, 1);
        if (k <= 0) {
            failed = i;
            code = k;
            break;
        }
        if (checksum) {
            uint32_t c = crc32c(out + at, (size_t)k);
            uint8_t le[4] = {(uint8_t)c, (uint8_t)(c >> 8), (uint8_t)(c >> 16),
                             (uint8_t)(c >> 24)};
            memcpy(out + at + k, le, 4);
            k += 4;
        }
        sz[i] = k;
        at += k;
    }
    Py_END_ALLOW_THREADS
    if (failed >= 0) {
        PyErr_Format(PyExc_RuntimeError, "error during blosc compression of row %zd: %d",
                     failed, code);
        goto done;
    }
    if (_PyBytes_Resize(&blob, at) != 0) goto done;
    result = Py_BuildValue("(OO)", blob, sizes);
done:
    release(&src);
    Py_XDECREF(blob);
    Py_XDECREF(sizes);
    return result;
}


/* The folders above file `path` created where missing (mkdir -p of its folder): 0, or -1
   with errno set. A shard of a field of several dimensions has a folder of its own
   (zarr's chunk key "c/<shard>/0"), made here on its first write, as is a temp folder. */
static int make_parents(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n >= sizeof(buf)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, n + 1);
    char *slash = strrchr(buf, '/');
    if (slash == NULL || slash == buf) return 0;
    *slash = '\0';
    if (mkdir(buf, 0777) == 0 || errno == EEXIST) return 0;
    if (errno != ENOENT || make_parents(buf) != 0) return -1;
    return mkdir(buf, 0777) == 0 || errno == EEXIST ? 0 : -1;
}

/* One fsync, run on a thread of its own by sync_all. */
typedef struct {
    int fd;
    int err;     /* errno of a failed fsync, else 0 (written by the job's thread) */
    int started; /* 1: a thread of its own runs it */
} fsync_job;

static void *run_fsync(void *arg) {
    fsync_job *job = arg;
    job->err = fsync(job->fd) != 0 ? errno : 0;
    return NULL;
}

/* fsync fds[0..n) at once, a thread each (the caller's thread takes fds[0]; a file whose
   thread cannot start is synced inline after): on a journaled file system a shard's files
   then share journal commits and device flushes, where synced one after another each
   waits for its own (docs/architecture.md §4). Returns the first i, in order, whose fsync
   failed, its errno in *err, or -1. jobs and threads: room for n each. Needs no GIL. */
static Py_ssize_t sync_all(const int *fds, Py_ssize_t n, fsync_job *jobs, pthread_t *threads,
                           int *err) {
    pthread_attr_t attr;
    int attr_ok = pthread_attr_init(&attr) == 0;
    if (attr_ok) pthread_attr_setstacksize(&attr, 64 * 1024);
    for (Py_ssize_t i = 0; i < n; i++) {
        jobs[i].fd = fds[i], jobs[i].err = 0;
        jobs[i].started =
            i > 0 && pthread_create(&threads[i], attr_ok ? &attr : NULL, run_fsync, &jobs[i]) == 0;
    }
    if (attr_ok) pthread_attr_destroy(&attr);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (jobs[i].started)
            pthread_join(threads[i], NULL);
        else
            run_fsync(&jobs[i]);
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (jobs[i].err != 0) {
            *err = jobs[i].err;
            return i;
        }
    return -1;
}

/* replace_files(tmps, paths, bufs, fsync) -> None | (i, errno)
   For each i: write bufs[i] (bytes-like) to a new file tmps[i] and, when fsync, sync it;
   then rename every tmps[i] over paths[i], in order. All files are written (their
   writeback started together where the system has sync_file_range) before the first
   fsync, and all synced (at once: sync_all) before the first rename, so readers see each
   object's old or new bytes and a crash before the renames leaves every object as it was. Missing folders
   (of a temp file or an object) are made. On a failure the
   temp files not renamed are removed and (i, errno) names the item that failed (objects
   before it in the rename order are replaced). Runs without the GIL. */
static PyObject *replace_files(PyObject *self, PyObject *args) {
    PyObject *tmps_o, *paths_o, *bufs_o;
    int do_fsync;
    if (!PyArg_ParseTuple(args, "O!O!O!p", &PyList_Type, &tmps_o, &PyList_Type, &paths_o,
                          &PyList_Type, &bufs_o, &do_fsync))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(tmps_o);
    if (PyList_GET_SIZE(paths_o) != n || PyList_GET_SIZE(bufs_o) != n) {
        PyErr_SetString(PyExc_ValueError, "replace_files: tmps, paths and bufs differ in length");
        return NULL;
    }
    const char **tmps = PyMem_Calloc((size_t)n + 1, sizeof(char *));
    const char **paths = PyMem_Calloc((size_t)n + 1, sizeof(char *));
    Py_buffer *bufs = PyMem_Calloc((size_t)n + 1, sizeof(Py_buffer));
    int *fds = PyMem_Calloc((size_t)n + 1, sizeof(int));
    fsync_job *jobs = PyMem_Calloc((size_t)n + 1, sizeof(fsync_job));
    pthread_t *threads = PyMem_Calloc((size_t)n + 1, sizeof(pthread_t));
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    if (tmps == NULL || paths == NULL || bufs == NULL || fds == NULL || jobs == NULL ||
        threads == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < n; got++) {  /* (the strings live as long as the lists the caller holds) */
        tmps[got] = PyUnicode_AsUTF8(PyList_GET_ITEM(tmps_o, got));
        paths[got] = PyUnicode_AsUTF8(PyList_GET_ITEM(paths_o, got));
        if (tmps[got] == NULL || paths[got] == NULL ||
            PyObject_GetBuffer(PyList_GET_ITEM(bufs_o, got), &bufs[got], PyBUF_SIMPLE) < 0)
            goto done;
        fds[got] = -1;
    }
    Py_ssize_t failed = -1, renamed = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && failed < 0; i++) {
        fds[i] = open(tmps[i], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fds[i] < 0 && errno == ENOENT && make_parents(tmps[i]) == 0)
            fds[i] = open(tmps[i], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fds[i] < 0) {
            failed = i, err = errno;
            break;
        }
        const char *at = bufs[i].buf;
        Py_ssize_t left = bufs[i].len;
        off_t off = 0;
        while (left > 0) {
            ssize_t k = pwrite(fds[i], at, (size_t)left, off);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) {
                failed = i, err = k < 0 ? errno : EIO;
                break;
            }
            at += k, left -= k, off += k;
        }
#ifdef SYNC_FILE_RANGE_WRITE
        if (failed < 0 && do_fsync)
            sync_file_range(fds[i], 0, 0, SYNC_FILE_RANGE_WRITE);  /* (a hint: start now) */
#endif
    }
    if (failed < 0 && do_fsync) failed = sync_all(fds, n, jobs, threads, &err);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (fds[i] >= 0 && close(fds[i]) != 0 && failed < 0) failed = i, err = errno;
        fds[i] = -1;
    }
    for (; renamed < n && failed < 0; renamed++)
        if (rename(tmps[renamed], paths[renamed]) != 0 &&
            (errno != ENOENT || make_parents(paths[renamed]) != 0 ||
             rename(tmps[renamed], paths[renamed]) != 0)) {
            failed = renamed, err = errno;
            break;
        }
    if (failed >= 0)
        for (Py_ssize_t i = renamed; i < n; i++) unlink(tmps[i]);  /* (ENOENT: not made) */
    Py_END_ALLOW_THREADS
    if (failed >= 0)
        result = Py_BuildValue("(ni)", failed, err);
    else
        Py_INCREF(Py_None), result = Py_None;
done:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&bufs[i]);
    PyMem_Free(tmps);
    PyMem_Free(paths);
    PyMem_Free(bufs);
    PyMem_Free(fds);
    PyMem_Free(jobs);
    PyMem_Free(threads);
    return result;
}

PyMethodDef write_kernel_methods[] = {
    {"stage_lanes", stage_lanes, METH_VARARGS,
     "stage_lanes(srcs, lanes, base, n, first, pub, row_bytes, step_field, steps, full) -> "
     "int\n\nOne row in each lane of lanes: field f's row i to base[f, lane] + n[lane] * "
     "row_bytes[f], the step id first[lane] + n[lane] into field step_field and steps[i]; "
     "then each lane's published count (int64 at pub[lane], unless 0) = ++n[lane]. Returns "
     "the lanes now holding full rows."},
    {"encode_rows", encode_rows, METH_VARARGS,
     "encode_rows(fn, src, n, row_bytes, typesize, clevel, shuffle, cname, blocksize, "
     "checksum) -> (blob, sizes)\n\nEncode rows 0..n of src (row_bytes each) as one blosc "
     "frame each with blosc_compress_ctx at address fn (numcodecs' own), each followed by "
     "its crc32c when checksum: the frames concatenated, and their sizes (int64 bytes). "
     "Runs without the GIL."},
    {"step_rows", step_rows, METH_VARARGS,
     "step_rows(srcs, nexts, dsts, term, trunc, ends, ep, flags, open_step) -> int\n\n"
     "The rows of T consecutive steps of one lane: srcs[f]'s T rows into dsts[f] with a "
     "final row after each step t where ends[t] (row t of nexts[f], or zeros where it is "
     "None); episode positions (int32) into ep and flags (uint8) into flags, counting from "
     "open_step. Returns the position of the lane's next row."},
    {"replace_files", replace_files, METH_VARARGS,
     "replace_files(tmps, paths, bufs, fsync) -> None | (i, errno)\n\nWrite each bufs[i] "
     "to a new file tmps[i] (synced when fsync), then rename each over paths[i]: all "
     "written and synced before the first rename. On failure the temp files not renamed "
     "are removed and (i, errno) names the item. Runs without the GIL."},
    {NULL, NULL, 0, NULL},
};

void write_kernels_init(void) { crc_init(); }
