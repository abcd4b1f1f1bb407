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
 * Registered on the module by ``PyInit__step`` through ``write_kernels.h``.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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
    {NULL, NULL, 0, NULL},
};

void write_kernels_init(void) { crc_init(); }
