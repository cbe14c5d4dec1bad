/* Runs every Python frame of a part through a C function named after the part, so that
 * callgrind files the frame's instructions under that function: a PEP 523 frame evaluator
 * that, when a frame's code belongs to another part than the running one, evaluates it
 * through budget_part_<n>. With every other function skipped (--fn-skip), the self cost of
 * budget_part_<n> is what ran while part n was the innermost. It also adds up the thread's
 * CPU time per part (clock_gettime(CLOCK_THREAD_CPUTIME_ID) at each change of part) when
 * timing is on. The part of a code object is asked once of a Python callable
 * (classify(code) -> (part from the library, part from elsewhere), -1 for "the caller's"). */
#define PY_SSIZE_T_CLEAN
#ifndef Py_BUILD_CORE_MODULE
#define Py_BUILD_CORE_MODULE 1
#endif
#include <Python.h>
#include <time.h>
#include "internal/pycore_frame.h"
#include <valgrind/callgrind.h>

#define PARTS 32
typedef PyObject *(*eval_fn)(PyThreadState *, _PyInterpreterFrame *, int);

static Py_ssize_t extra = -1;
static PyObject *classify = NULL;
static unsigned char library[PARTS];
static _Thread_local int current = 0, active = 0, timing = 0, classifying = 0;
static _Thread_local long long last = 0;
static long long spent[PARTS];
static long long changes = 0;

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#define PART(n) \
    __attribute__((noinline)) PyObject *budget_part_##n( \
        PyThreadState *ts, _PyInterpreterFrame *f, int t) { \
        PyObject *r = _PyEval_EvalFrameDefault(ts, f, t); \
        __asm__ volatile("" ::: "memory"); \
        return r; \
    }
PART(0) PART(1) PART(2) PART(3) PART(4) PART(5) PART(6) PART(7) PART(8) PART(9)
PART(10) PART(11) PART(12) PART(13) PART(14) PART(15) PART(16) PART(17) PART(18) PART(19)
PART(20) PART(21) PART(22) PART(23) PART(24) PART(25) PART(26) PART(27) PART(28) PART(29)
PART(30) PART(31)
static eval_fn through[PARTS] = {
    budget_part_0, budget_part_1, budget_part_2, budget_part_3, budget_part_4, budget_part_5,
    budget_part_6, budget_part_7, budget_part_8, budget_part_9, budget_part_10,
    budget_part_11, budget_part_12, budget_part_13, budget_part_14, budget_part_15,
    budget_part_16, budget_part_17, budget_part_18, budget_part_19, budget_part_20,
    budget_part_21, budget_part_22, budget_part_23, budget_part_24, budget_part_25,
    budget_part_26, budget_part_27, budget_part_28, budget_part_29, budget_part_30,
    budget_part_31};

/* (from the library + 1) << 8 | (from elsewhere + 1), with 1 << 16 set once known. */
static intptr_t part_of(PyCodeObject *code) {
    void *known = NULL;
    if (_PyCode_GetExtra((PyObject *)code, extra, &known) == 0 && known != NULL)
        return (intptr_t)known;
    intptr_t value = 1 << 16;
    classifying = 1;
    PyObject *result = PyObject_CallOneArg(classify, (PyObject *)code);
    classifying = 0;
    int lib = -1, other = -1;
    if (result == NULL || !PyArg_ParseTuple(result, "ii", &lib, &other)) {
        PyErr_Clear();
        lib = other = -1;
    }
    Py_XDECREF(result);
    if (lib >= PARTS || lib < -1) lib = -1;
    if (other >= PARTS || other < -1) other = -1;
    value |= ((intptr_t)(lib + 1) << 8) | (intptr_t)(other + 1);
    _PyCode_SetExtra((PyObject *)code, extra, (void *)value);
    return value;
}

static PyObject *evaluate(PyThreadState *ts, _PyInterpreterFrame *f, int t) {
    if (!active || classifying) return _PyEval_EvalFrameDefault(ts, f, t);
    intptr_t value = part_of(f->f_code);
    int part = (library[current] ? ((value >> 8) & 0xff) : (value & 0xff)) - 1;
    if (part < 0 || part == current) return _PyEval_EvalFrameDefault(ts, f, t);
    int caller = current;
    changes++;
    if (timing) {
        long long t0 = now_ns();
        spent[caller] += t0 - last;
        last = t0;
    }
    current = part;
    PyObject *r = through[part](ts, f, t);
    current = caller;
    if (timing) {
        long long t1 = now_ns();
        spent[part] += t1 - last;
        last = t1;
    }
    return r;
}

__attribute__((noinline)) PyObject *budget_part_root(PyObject *callable) {
    PyObject *r = PyObject_CallNoArgs(callable);
    __asm__ volatile("" ::: "memory");
    return r;
}

/* install(classify, library parts): the evaluator on, for run() to use. */
static PyObject *install(PyObject *self, PyObject *args) {
    PyObject *fn, *parts;
    if (!PyArg_ParseTuple(args, "OO", &fn, &parts)) return NULL;
    if (extra < 0) extra = _PyEval_RequestCodeExtraIndex(NULL);
    Py_XSETREF(classify, Py_NewRef(fn));
    memset(library, 0, sizeof library);
    PyObject *it = PyObject_GetIter(parts), *item;
    if (it == NULL) return NULL;
    while ((item = PyIter_Next(it)) != NULL) {
        long n = PyLong_AsLong(item);
        Py_DECREF(item);
        if (n >= 0 && n < PARTS) library[n] = 1;
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) return NULL;
    _PyInterpreterState_SetEvalFrameFunc(PyInterpreterState_Get(), evaluate);
    Py_RETURN_NONE;
}

/* run(callable, timed): callable() in part 0, each frame through its part's function. */
static PyObject *run(PyObject *self, PyObject *args) {
    PyObject *fn;
    int timed = 0;
    if (!PyArg_ParseTuple(args, "O|p", &fn, &timed)) return NULL;
    active = 1;
    current = 0;
    timing = timed;
    if (timing) last = now_ns();
    PyObject *r = budget_part_root(fn);
    if (timing) spent[0] += now_ns() - last;
    active = timing = 0;
    return r;
}

static PyObject *times(PyObject *self, PyObject *unused) {
    PyObject *list = PyList_New(PARTS);
    if (list == NULL) return NULL;
    for (int i = 0; i < PARTS; i++) {
        PyList_SET_ITEM(list, i, PyLong_FromLongLong(spent[i]));
        spent[i] = 0;
    }
    return list;
}

static PyObject *changed(PyObject *self, PyObject *unused) {
    long long n = changes;
    changes = 0;
    return PyLong_FromLongLong(n);
}

static PyObject *collect(PyObject *self, PyObject *unused) {
    CALLGRIND_TOGGLE_COLLECT;
    Py_RETURN_NONE;
}

static PyObject *dump(PyObject *self, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    CALLGRIND_DUMP_STATS_AT(name);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"install", install, METH_VARARGS, "install(classify, library_parts)"},
    {"run", run, METH_VARARGS, "run(callable, timed=False)"},
    {"times", times, METH_NOARGS, "CPU ns per part since the last call"},
    {"changed", changed, METH_NOARGS, "changes of part since the last call"},
    {"collect", collect, METH_NOARGS, "toggle callgrind's collection"},
    {"dump", dump, METH_VARARGS, "dump callgrind's counts under a name, and zero them"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_parts", NULL, -1, methods};

PyMODINIT_FUNC PyInit__parts(void) { return PyModule_Create(&module); }
