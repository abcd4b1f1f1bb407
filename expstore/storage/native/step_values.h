/* expstore.storage.native._step: the values of one step, as the Python checks take them.
 * Included once, by ``_step.c`` (one translation unit: numpy's C API is imported there). */

/* ---- values ------------------------------------------------------------------------ */

/* one scalar of a single step: 1 and its bytes in out when accepted as is, else 0 */
static int scalar_value(const vfield *vf, PyObject *v, uint8_t *out) {
    if (vf->kind == 'b') {
        uint8_t b;
        if (v == Py_True) b = 1;
        else if (v == Py_False) b = 0;
        else if (PyArray_IsScalar(v, Bool)) b = PyArrayScalar_VAL(v, Bool) ? 1 : 0;
        else return 0;
        out[0] = b;
        return 1;
    }
    if (vf->kind == 'i' || vf->kind == 'u') {
        long long x;
        if (PyLong_CheckExact(v)) {
            int over = 0;
            x = PyLong_AsLongLongAndOverflow(v, &over);
            if (over || (x == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                return 0;
            }
        }
#define INT_SCALAR(T) else if (PyArray_IsScalar(v, T)) x = (long long)PyArrayScalar_VAL(v, T);
        INT_SCALAR(Byte) INT_SCALAR(Short) INT_SCALAR(Int) INT_SCALAR(Long)
        INT_SCALAR(LongLong) INT_SCALAR(UByte) INT_SCALAR(UShort) INT_SCALAR(UInt)
#undef INT_SCALAR
        else if (PyArray_IsScalar(v, ULong)) {
            unsigned long u = PyArrayScalar_VAL(v, ULong);
            if (u > (unsigned long)LLONG_MAX) return 0;
            x = (long long)u;
        } else if (PyArray_IsScalar(v, ULongLong)) {
            unsigned long long u = PyArrayScalar_VAL(v, ULongLong);
            if (u > (unsigned long long)LLONG_MAX) return 0;
            x = (long long)u;
        } else return 0;
        if (x < vf->ilo || x > vf->ihi) return 0;
        memcpy(out, &x, (size_t)vf->itemsize); /* little-endian: the low bytes */
        return 1;
    }
    if (vf->kind == 'f') {
        double x;
        if (PyFloat_CheckExact(v) || PyArray_IsScalar(v, Double)) {
            x = PyFloat_AS_DOUBLE(v);
            if (!(-vf->top <= x && x <= vf->top)) return 0;
        } else if (PyArray_IsScalar(v, Float)) {
            x = (double)PyArrayScalar_VAL(v, Float);
            if (!(-vf->top <= x && x <= vf->top)) return 0;
        } else if (PyLong_CheckExact(v)) {
            int over = 0;
            long long i = PyLong_AsLongLongAndOverflow(v, &over);
            if (over || (i == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                return 0;
            }
            if (!(-vf->exact <= (double)i && (double)i <= vf->exact)) return 0;
            x = (double)i;
        } else return 0;
        if (!(vf->flo <= x && x <= vf->fhi)) return 0;
        if (vf->itemsize == 4) {
            float f = (float)x;
            memcpy(out, &f, 4);
        } else {
            memcpy(out, &x, 8);
        }
        return 1;
    }
    return 0;
}

static double elem(int type_num, const uint8_t *p, Py_ssize_t e) {
    switch (type_num) {
    case NPY_FLOAT: return (double)((const float *)p)[e];
    case NPY_DOUBLE: return ((const double *)p)[e];
    case NPY_BYTE: return (double)((const int8_t *)p)[e];
    case NPY_UBYTE: return (double)((const uint8_t *)p)[e];
    case NPY_SHORT: return (double)((const int16_t *)p)[e];
    case NPY_USHORT: return (double)((const uint16_t *)p)[e];
    case NPY_INT: return (double)((const int32_t *)p)[e];
    case NPY_UINT: return (double)((const uint32_t *)p)[e];
    case NPY_LONG: return (double)((const long *)p)[e];
    case NPY_ULONG: return (double)((const unsigned long *)p)[e];
    case NPY_LONGLONG: return (double)((const long long *)p)[e];
    case NPY_ULONGLONG: return (double)((const unsigned long long *)p)[e];
    case NPY_BOOL: return (double)((const uint8_t *)p)[e];
    default: return NAN; /* (never: the plan has only these types) */
    }
}

/* Elements of one row (of type src_type) as the field stores them: finite where required,
   within bounds. 1: accepted. */
static int row_ok(const vfield *vf, const uint8_t *p, int src_type, int full_check) {
    if (!full_check || vf->kind == 'b') return 1;
    int fin = vf->finite && vf->kind == 'f';
    if (!fin && vf->alo == NULL && vf->ahi == NULL) return 1;
    for (Py_ssize_t e = 0; e < vf->elems; e++) {
        double x = elem(src_type, p, e);
        if (vf->kind == 'f' && vf->itemsize == 4) x = (double)(float)x; /* as stored */
        if (fin && !isfinite(x)) return 0;
        if (vf->alo && x < vf->alo[e]) return 0;
        if (vf->ahi && x > vf->ahi[e]) return 0;
    }
    return 1;
}

static void put_row(const vfield *vf, const uint8_t *src, int src_type, uint8_t *dst) {
    if (src_type == vf->type_num) {
        memcpy(dst, src, (size_t)vf->row_bytes);
        return;
    }
    for (Py_ssize_t e = 0; e < vf->elems; e++) { /* float -> float, as numpy casts */
        double x = elem(src_type, src, e);
        if (vf->itemsize == 4) ((float *)dst)[e] = (float)x;
        else ((double *)dst)[e] = x;
    }
}

/* An array value: rows of `lanes` lanes (lanes = 0: one step, no leading axis) of the field's
   shape, or whole frame stacks (then the newest frame of each). Sets *data to the first
   row, *stride to the bytes between lanes' rows, *src_type. `cast`: a float array of
   another float dtype is accepted (cast as numpy casts). 1: usable. */
static int array_value(const vfield *vf, PyObject *v, Py_ssize_t lanes, int cast,
                       const uint8_t **data, Py_ssize_t *stride, int *src_type) {
    if (!PyArray_CheckExact(v)) return 0;
    PyArrayObject *a = (PyArrayObject *)v;
    int t = PyArray_TYPE(a);
    if (!PyArray_ISNOTSWAPPED(a) || !PyArray_IS_C_CONTIGUOUS(a)) return 0;
    if (t != vf->type_num) {
        if (!(cast && vf->kind == 'f' && (t == NPY_FLOAT || t == NPY_DOUBLE))) return 0;
    }
    int lead = lanes > 0 ? 1 : 0;
    int nd = PyArray_NDIM(a);
    npy_intp *dims = PyArray_DIMS(a);
    if (lead && (nd < 1 || dims[0] != lanes)) return 0;
    Py_ssize_t isz = PyArray_ITEMSIZE(a);
    Py_ssize_t row = vf->elems * isz;
    const uint8_t *p = PyArray_DATA(a);
    if (nd == lead + vf->ndim) {
        for (int d = 0; d < vf->ndim; d++)
            if (dims[lead + d] != vf->shape[d]) return 0;
        *stride = row;
    } else if (vf->stack && nd == lead + 1 + vf->ndim && dims[lead] == vf->stack) {
        for (int d = 0; d < vf->ndim; d++)
            if (dims[lead + 1 + d] != vf->shape[d]) return 0;
        p += (vf->stack - 1) * row; /* the newest frame */
        *stride = vf->stack * row;
    } else {
        return 0;
    }
    *data = p;
    *src_type = t;
    return 1;
}

