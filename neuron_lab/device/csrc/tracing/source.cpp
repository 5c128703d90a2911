// The user's source line of each recorded op, so that an error raised later,
// or the profiler, can point at the line that issued it.
//
// Ops are dispatched with the GIL released, and taking it back per op would
// stall behind any other Python thread (the background compiler); CPython's public
// frame APIs need the GIL. So the calling thread's own frame stack is read instead,
// through CPython's frame structs: it cannot change while this thread runs C++,
// and nothing is allocated or reference-counted. Those structs are private and change
// between minor versions, so the few fields read are reached through the accessors
// below, one set per CPython version, chosen when the extension is compiled (it is
// built for one Python anyway): 3.11, 3.12 and 3.13 (pyproject.toml's requires-python;
// _build_backend.py and setup.py refuse other versions before anything is built).
//
// Cost: a walk over the innermost frames, skipping library frames (torch,
// neuron_lab, the standard library), one lock-free per-thread lookup per frame and
// a cached line-table lookup for the frame kept (cached_line); no strings are made per
// op. (A runtime that records ops may capture a line per op, and let users turn that off.)
#include "trace.h"

#include <Python.h>

#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030E0000
#error "neuron_lab reads CPython 3.11-3.13's frame stack (see above): build it with one of those"
#endif
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE

#include <array>
#include <atomic>
#include <deque>
#include <fstream>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace neuron::trace {
namespace {

// ---- the frame stack, per CPython version ----------------------------------------
// The innermost frame of a thread: 3.11 and 3.12 keep it in the thread's C frame
// (tstate->cframe), 3.13 in the thread state itself.
inline _PyInterpreterFrame* innermost_frame(PyThreadState* ts) {
#if PY_VERSION_HEX >= 0x030D0000
  return ts->current_frame;
#else
  return ts->cframe == nullptr ? nullptr : ts->cframe->current_frame;
#endif
}

// A frame's code object, or nullptr for a frame that runs none. 3.13 renamed f_code to
// f_executable, which holds a code object or None (the C stack's entry frames).
inline PyCodeObject* code_of(_PyInterpreterFrame* f) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyCode_Check(f->f_executable) ? reinterpret_cast<PyCodeObject*>(f->f_executable) : nullptr;
#else
  return f->f_code;
#endif
}

// Whether a frame runs code yet: not still setting up (before its first traceable
// instruction) and not the interpreter's own entry frame on the C stack (3.12 and 3.13;
// 3.13's header tests that first, 3.12's entry frame fails the first test).
inline bool is_running_code(_PyInterpreterFrame* f) {
#if PY_VERSION_HEX >= 0x030C0000
  if (f->owner == FRAME_OWNED_BY_CSTACK) return false;
#endif
  return code_of(f) != nullptr && !_PyFrame_IsIncomplete(f);
}

// The code unit a frame is at, as CPython's frame.f_lasti counts (in units): the header's
// macro reads prev_instr (3.11, 3.12) or instr_ptr (3.13).
inline int instruction_of(_PyInterpreterFrame* f) { return _PyInterpreterFrame_LASTI(f); }

struct CodeEntry {
  std::string file, function;
  bool library = false;
};

std::mutex g_mutex;
std::deque<CodeEntry>& entries() {
  static auto* e = new std::deque<CodeEntry>();
  return *e;
}
std::vector<std::string>& library_prefixes() {
  static auto* p = new std::vector<std::string>();
  return *p;
}

std::string ascii_or_unknown(PyObject* s) {
  if (s != nullptr && PyUnicode_Check(s) && PyUnicode_IS_COMPACT_ASCII(s)) {
    return std::string(static_cast<const char*>(PyUnicode_DATA(s)), static_cast<size_t>(PyUnicode_GET_LENGTH(s)));
  }
  return "?";
}

struct CodeKey {
  PyObject* filename;
  PyObject* name;
  int firstlineno;
};
std::unordered_map<PyCodeObject*, std::pair<CodeKey, int32_t>>& by_code() {
  static auto* m = new std::unordered_map<PyCodeObject*, std::pair<CodeKey, int32_t>>();
  return *m;
}

// Interns a code object's file and function. Safe without the GIL: the code
// object is alive (its frame is running) and nothing is allocated by Python.
// A recycled address is recognised by its different file, name or first line.
int32_t intern(PyCodeObject* code) {
  const CodeKey key{code->co_filename, code->co_name, code->co_firstlineno};
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = by_code().find(code);
  if (it != by_code().end() && it->second.first.filename == key.filename && it->second.first.name == key.name &&
      it->second.first.firstlineno == key.firstlineno) {
    return it->second.second;
  }
  CodeEntry e;
  e.file = ascii_or_unknown(code->co_filename);
  e.function = ascii_or_unknown(code->co_name);
  for (const auto& prefix : library_prefixes()) {
    if (e.file.compare(0, prefix.size(), prefix) == 0) e.library = true;
  }
  if (e.file.rfind("<frozen", 0) == 0) e.library = true;
  const auto id = static_cast<int32_t>(entries().size());
  entries().push_back(std::move(e));
  by_code()[code] = {key, id};
  return id;
}

bool is_library(int32_t id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return entries()[static_cast<size_t>(id)].library;
}

// Per thread, the code objects seen last (direct-mapped by address): a frame walk then
// takes no lock. An entry is valid while its code object's file, name and first line
// match (a recycled address shows another). set_library_prefixes bumps the generation.
std::atomic<uint32_t> g_generation{1};
struct CachedCode {
  PyCodeObject* code = nullptr;
  CodeKey key{};
  uint32_t generation = 0;
  int32_t id = -1;
  bool library = false;
};
constexpr size_t kCachedCodes = 256;
thread_local std::array<CachedCode, kCachedCodes> tl_codes;

const CachedCode& lookup(PyCodeObject* code) {
  auto& slot = tl_codes[(reinterpret_cast<uintptr_t>(code) >> 4) % kCachedCodes];
  const uint32_t generation = g_generation.load(std::memory_order_relaxed);
  if (slot.code == code && slot.generation == generation && slot.key.filename == code->co_filename &&
      slot.key.name == code->co_name && slot.key.firstlineno == code->co_firstlineno) {
    return slot;
  }
  slot.code = code;
  slot.key = {code->co_filename, code->co_name, code->co_firstlineno};
  slot.generation = generation;
  slot.id = intern(code);
  slot.library = is_library(slot.id);
  return slot;
}

// Per thread, the line of the instructions seen last (a loop issues its ops from the same
// few): decoding a line table costs more than the rest of the walk. An entry is valid for
// the same code object (address, line table) and instruction.
struct CachedLine {
  PyCodeObject* code = nullptr;
  PyObject* linetable = nullptr;
  int lasti = -1;
  int line = 0;
};
constexpr size_t kCachedLines = 512;
thread_local std::array<CachedLine, kCachedLines> tl_lines;

// Per thread and code object, the line of each of its instructions, decoded in one forward
// pass: torch.compile's FX graphs run hundreds of ops from one function, more instructions
// than the line cache above holds, and decoding each miss from the table's start made line
// lookups a tenth of the host's time in a compiled training step. A table is reused only
// for the same code object, line table, table length, first line and size; a code object
// freed and another allocated at its address with all of those equal could read a wrong
// line, never outside the table.
struct LineTable {
  PyCodeObject* code = nullptr;
  PyObject* linetable = nullptr;
  Py_ssize_t length = 0;
  int firstlineno = 0;
  std::vector<int> line_of_unit;  // indexed by instruction (code unit)
};
constexpr size_t kLineTables = 64;
constexpr Py_ssize_t kMaxTabledUnits = Py_ssize_t{1} << 16;  // bigger functions: CPython's lookup
thread_local std::array<LineTable, kLineTables> tl_tables;

int decode_line(PyCodeObject* code, int lasti) {
  if (lasti < 0) return code->co_firstlineno;  // as PyCode_Addr2Line
  const Py_ssize_t units = Py_SIZE(code);      // CPython 3.11-3.13: the code's length in code units
  if (units > kMaxTabledUnits || lasti >= units) {
    return PyCode_Addr2Line(code, lasti * static_cast<int>(sizeof(_Py_CODEUNIT)));
  }
  auto& t = tl_tables[(reinterpret_cast<uintptr_t>(code) >> 4) % kLineTables];
  const Py_ssize_t length = PyBytes_GET_SIZE(code->co_linetable);
  if (t.code != code || t.linetable != code->co_linetable || t.length != length ||
      t.firstlineno != code->co_firstlineno || static_cast<Py_ssize_t>(t.line_of_unit.size()) != units) {
    t.code = code;
    t.linetable = code->co_linetable;
    t.length = length;
    t.firstlineno = code->co_firstlineno;
    // What CPython's _PyCode_InitAddressRange does (not exported): before the first entry;
    // its decoder then only steps forward.
    PyCodeAddressRange range{};
    const auto* table = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(code->co_linetable));
    range.opaque.lo_next = table;
    range.opaque.limit = table + length;
    range.opaque.computed_line = code->co_firstlineno;
    range.ar_start = -1;
    range.ar_end = 0;
    range.ar_line = -1;
    t.line_of_unit.resize(static_cast<size_t>(units));
    for (Py_ssize_t unit = 0; unit < units; ++unit) {
      t.line_of_unit[static_cast<size_t>(unit)] =
          _PyCode_CheckLineNumber(static_cast<int>(unit * static_cast<Py_ssize_t>(sizeof(_Py_CODEUNIT))), &range);
    }
  }
  return t.line_of_unit[static_cast<size_t>(lasti)];
}

int cached_line(PyCodeObject* code, int lasti) {
  auto& slot = tl_lines[((reinterpret_cast<uintptr_t>(code) >> 4) ^ static_cast<uintptr_t>(lasti) * 2654435761u) %
                        kCachedLines];
  if (slot.code == code && slot.lasti == lasti && slot.linetable == code->co_linetable) return slot.line;
  slot = {code, code->co_linetable, lasti, decode_line(code, lasti)};
  return slot.line;
}

}  // namespace

void set_library_prefixes(std::vector<std::string> prefixes) {
  g_generation.fetch_add(1);
  std::lock_guard<std::mutex> lock(g_mutex);
  library_prefixes() = std::move(prefixes);
  for (auto& e : entries()) {
    e.library = false;
    for (const auto& prefix : library_prefixes()) {
      if (e.file.compare(0, prefix.size(), prefix) == 0) e.library = true;
    }
  }
}

Source capture() {
  if (!Py_IsInitialized()) return {};
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (ts == nullptr) return {};
  auto line_of = [](_PyInterpreterFrame* f) { return cached_line(code_of(f), instruction_of(f)); };
  _PyInterpreterFrame* first = nullptr;
  int32_t first_id = -1;
  int depth = 0;
  for (_PyInterpreterFrame* frame = innermost_frame(ts); frame != nullptr && depth < 64; frame = frame->previous) {
    if (!is_running_code(frame)) continue;
    const auto& code = lookup(code_of(frame));
    if (depth++ == 0) first = frame, first_id = code.id;
    if (!code.library) return {code.id, line_of(frame)};  // a line number only for the frame kept
  }
  if (first != nullptr) return {first_id, line_of(first)};
  return {};
}

namespace {
struct NamedFile {
  std::string name;
  std::vector<std::string> lines;
};
std::unordered_map<std::string, NamedFile>& named_files() {
  static auto* m = new std::unordered_map<std::string, NamedFile>();
  return *m;
}
constexpr size_t kMaxNamedFiles = 4096;  // a long notebook session's cells

std::string strip(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}
}  // namespace

void set_source_name(const std::string& file, const std::string& name, std::vector<std::string> lines) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& files = named_files();
  if (files.size() >= kMaxNamedFiles && files.find(file) == files.end()) files.clear();
  files[file] = NamedFile{name, std::move(lines)};
}

std::string describe(Source loc) {
  if (loc.file < 0) return "an unknown line (recorded outside Python, e.g. by autograd's backward pass)";
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto& e = entries()[static_cast<size_t>(loc.file)];
  const auto named = named_files().find(e.file);
  if (named != named_files().end()) {  // as IPython's tracebacks name a cell's line
    return named->second.name + ", line " + std::to_string(loc.line) +
           (e.function == "<module>" ? std::string() : ", in " + e.function);
  }
  return e.file + ":" + std::to_string(loc.line) + " in " + e.function;
}

std::string source_text(const SourceFrame& where) {
  if (where.line < 1 || where.file.empty()) return "";
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    const auto named = named_files().find(where.file);
    if (named != named_files().end()) {
      const auto& lines = named->second.lines;
      return static_cast<size_t>(where.line) <= lines.size() ? strip(lines[where.line - 1]) : "";
    }
  }
  std::ifstream in(where.file);
  std::string text;
  for (int n = 0; n < where.line && std::getline(in, text); ++n) {
    if (n + 1 == where.line) return strip(text);
  }
  return "";
}

std::string source_text(Source loc) { return loc.file < 0 ? "" : source_text(frame(loc)); }

SourceFrame frame(Source loc) {
  if (loc.file < 0) return {};
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto& e = entries()[static_cast<size_t>(loc.file)];
  return {e.file, loc.line, e.function};
}

}  // namespace neuron::trace
