#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#include "internal/pycore_frame.h"
#include "internal/pycore_code.h"
#define P(name, expr) printf("%s %zu\n", name, (size_t)(expr))
int main(void) {
  P("runtime.interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
  P("interp.threads_head", offsetof(PyInterpreterState, threads.head));
  P("interp.next", offsetof(PyInterpreterState, next));
  P("tstate.next", offsetof(PyThreadState, next));
  P("tstate.native_thread_id", offsetof(PyThreadState, native_thread_id));
  P("tstate.thread_id", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX >= 0x030D0000
  P("tstate.current_frame", offsetof(PyThreadState, current_frame));
  P("frame.code", offsetof(_PyInterpreterFrame, f_executable));
  P("frame.instr", offsetof(_PyInterpreterFrame, instr_ptr));
#else
  P("tstate.cframe", offsetof(PyThreadState, cframe));
  P("cframe.current_frame", offsetof(_PyCFrame, current_frame));
  P("frame.code", offsetof(_PyInterpreterFrame, f_code));
  P("frame.instr", offsetof(_PyInterpreterFrame, prev_instr));
#endif
  P("frame.previous", offsetof(_PyInterpreterFrame, previous));
  P("frame.owner", offsetof(_PyInterpreterFrame, owner));
  P("code.filename", offsetof(PyCodeObject, co_filename));
  P("code.name", offsetof(PyCodeObject, co_name));
  P("code.qualname", offsetof(PyCodeObject, co_qualname));
  P("code.firstlineno", offsetof(PyCodeObject, co_firstlineno));
  P("code.linetable", offsetof(PyCodeObject, co_linetable));
  P("code.code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
  P("code.ob_type", offsetof(PyObject, ob_type));
  P("unicode.state", offsetof(PyASCIIObject, state));
  P("unicode.length", offsetof(PyASCIIObject, length));
  P("unicode.ascii_data", sizeof(PyASCIIObject));
  P("unicode.compact_data", sizeof(PyCompactUnicodeObject));
  P("bytes.size", offsetof(PyVarObject, ob_size));
  P("bytes.data", offsetof(PyBytesObject, ob_sval));
  P("sizeof.frame", sizeof(_PyInterpreterFrame));
  return 0;
}
