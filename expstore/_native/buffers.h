/* Buffers of Python objects as the C kernels take them, for every C source of the package
 * (storage/native/_kernels.c, _step.c, _write.c; index/_rows.c): one definition of how an
 * argument's memory is held, checked and let go. Static (inline) functions: each translation unit
 * that includes this gets its own copy. Include after <Python.h>. */
#ifndef EXPSTORE_BUFFERS_H
#define EXPSTORE_BUFFERS_H

#include <string.h>

/* a Py_buffer and whether it is held (release() is safe on one never taken) */
typedef struct {
    Py_buffer view;
    int held;
} held_buffer;

/* ``obj``'s C-contiguous buffer (``writable``: writable too), its length a multiple of
   ``itemsize`` bytes (0: any length). 0, or -1 with an exception set; release() it either
   way. */
static inline int take(PyObject *obj, held_buffer *b, size_t itemsize, int writable,
                const char *what) {
    int flags = writable ? (PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) : PyBUF_C_CONTIGUOUS;
    if (PyObject_GetBuffer(obj, &b->view, flags) != 0) return -1;
    b->held = 1;
    if (itemsize && b->view.len % (Py_ssize_t)itemsize != 0) {
        PyErr_Format(PyExc_ValueError, "%s: length is not a multiple of %zu bytes", what,
                     itemsize);
        return -1;
    }
    return 0;
}

/* ``obj``'s C-contiguous buffer of ``itemsize``-byte items of a checked format: signed
   integers, or for 1 byte uint8 / bool. 0, or -1 with an exception set; release() it
   either way. */
static inline int take_ints(PyObject *obj, held_buffer *b, Py_ssize_t itemsize, int writable,
                     const char *what) {
    int flags = writable ? (PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) : PyBUF_C_CONTIGUOUS;
    if (PyObject_GetBuffer(obj, &b->view, flags | PyBUF_FORMAT) != 0) return -1;
    b->held = 1;
    const char *fmt = b->view.format ? b->view.format : "B";
    char kind = fmt[strlen(fmt) - 1]; /* (after a byte-order mark, if any) */
    int ok = itemsize == 1 ? (kind == 'B' || kind == '?')
                           : (kind == 'q' || kind == 'l' || kind == 'i') &&
                                 b->view.itemsize == itemsize;
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: expected signed integers of %zd bytes%s, got "
                     "format '%s'", what, itemsize, itemsize == 1 ? " (or bool)" : "", fmt);
        return -1;
    }
    return 0;
}

static inline void release(held_buffer *b) {
    if (b->held) PyBuffer_Release(&b->view);
    b->held = 0;
}

#endif
