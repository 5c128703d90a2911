// A minimal extension around the device's source-line capture (device/csrc/source.cpp)
// alone, so its frame layouts can be checked on every supported CPython without building
// the whole device against a torch for each (tests/device/test_source_lines.py). It calls
// capture() as an op does: from C++, with the GIL released.
#include <Python.h>

#include <string>
#include <vector>

#include "trace.h"

namespace {

PyObject* capture_line(PyObject*, PyObject*) {
  neuron::trace::Source where;
  Py_BEGIN_ALLOW_THREADS
  where = neuron::trace::capture();
  Py_END_ALLOW_THREADS
  if (where.file < 0) Py_RETURN_NONE;
  const auto frame = neuron::trace::frame(where);
  return Py_BuildValue("(sis)", frame.file.c_str(), frame.line, frame.function.c_str());
}

PyObject* set_library_prefixes(PyObject*, PyObject* prefixes) {
  PyObject* items = PySequence_Fast(prefixes, "library prefixes: a list of str");
  if (items == nullptr) return nullptr;
  std::vector<std::string> values;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items); ++i) {
    const char* text = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(items, i));
    if (text == nullptr) {
      Py_DECREF(items);
      return nullptr;
    }
    values.emplace_back(text);
  }
  Py_DECREF(items);
  neuron::trace::set_library_prefixes(std::move(values));
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"capture", capture_line, METH_NOARGS, "(file, line, function) of the caller's first non-library frame, or None."},
    {"set_library_prefixes", set_library_prefixes, METH_O, "Files under these prefixes are skipped."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "source_probe", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_source_probe() { return PyModule_Create(&module); }
