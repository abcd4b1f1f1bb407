/* What ``_write.c`` (the write side's batch kernels) gives the ``_step`` extension, whose
 * module init (``_step.c``) registers them. */
#ifndef EXPSTORE_WRITE_KERNELS_H
#define EXPSTORE_WRITE_KERNELS_H

#include <Python.h>

/* encode_rows, stage_lanes, step_rows, replace_files (NULL-terminated) */
extern PyMethodDef write_kernel_methods[];

/* once, before any of them runs (the crc32c table) */
void write_kernels_init(void);

#endif
