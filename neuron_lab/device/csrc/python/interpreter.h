// Whether the Python interpreter can still run code: initialized and not finalizing.
// CPython's check for finalization is private before 3.13 (_Py_IsFinalizing) and public,
// under another name, from 3.13 (Py_IsFinalizing, the private one removed). Native code
// asks here, so that private CPython names stay in one place per concern (frame layouts
// live in tracing/source.cpp).
#pragma once

#include <Python.h>

namespace neuron {

inline bool python_can_run() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

}  // namespace neuron
