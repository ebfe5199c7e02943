#define Py_BUILD_CORE 1
#include <Python.h>
#include <frameobject.h>
#include <stddef.h>
#include <stdio.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#define P(name, expr) printf("%s %zu\n", name, (size_t)(expr))
int main(void) {
  P("runtime.interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
  P("interp.threads_head", offsetof(PyInterpreterState, tstate_head));
  P("tstate.next", offsetof(PyThreadState, next));
  P("tstate.thread_id", offsetof(PyThreadState, thread_id));
  P("tstate.frame", offsetof(PyThreadState, frame));
  P("frame.back", offsetof(PyFrameObject, f_back));
  P("frame.code", offsetof(PyFrameObject, f_code));
  P("frame.lasti", offsetof(PyFrameObject, f_lasti));
  P("code.filename", offsetof(PyCodeObject, co_filename));
  P("code.name", offsetof(PyCodeObject, co_name));
  P("code.firstlineno", offsetof(PyCodeObject, co_firstlineno));
#if PY_VERSION_HEX >= 0x030A0000
  P("code.linetable", offsetof(PyCodeObject, co_linetable));
#else
  P("code.linetable", offsetof(PyCodeObject, co_lnotab));
#endif
  P("unicode.ascii_data", sizeof(PyASCIIObject));
  return 0;
}
