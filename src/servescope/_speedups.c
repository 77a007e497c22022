/* servescope._speedups: a stage's enter and exit in C.
 *
 * The same logic as timing.Stage.__enter__/__exit__ (the pure-Python fallback, which stays the
 * reference), on the same span lists and the same ContextVar: a span is the list
 * [name, start, end, parent, trace, token, child_ns]. What C saves is the interpreter's
 * frames and attribute lookups on the hot path; the clock is the trace's own `_mark`, except
 * that on Linux the wall clock (time.perf_counter_ns, which is CLOCK_MONOTONIC there) is read
 * directly.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>
#include <time.h>

enum { NAME, START, END, PARENT, TRACE, TOKEN, CHILD, NFIELDS };

static PyObject *current_var = NULL; /* timing._current */
static PyObject *wall_mark = NULL;   /* time.perf_counter_ns */
static PyObject *str_mark = NULL;    /* "_mark" */
static PyObject *str_spans = NULL;   /* "_spans" */
static PyObject *zero = NULL;

typedef struct {
    PyObject_HEAD
    PyObject *name;
} StageBase;

static PyObject *
mark(PyObject *trace)
{
    PyObject *fn = PyObject_GetAttr(trace, str_mark);
    if (fn == NULL)
        return NULL;
#ifdef __linux__
    if (fn == wall_mark) {
        struct timespec ts;
        Py_DECREF(fn);
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    }
#endif
    PyObject *t = PyObject_CallNoArgs(fn);
    Py_DECREF(fn);
    return t;
}

static PyObject *
stage_enter(StageBase *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *parent = NULL;
    if (current_var == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "servescope._speedups.setup() was not called");
        return NULL;
    }
    if (PyContextVar_Get(current_var, NULL, &parent) < 0)
        return NULL;
    if (parent == NULL || parent == Py_None || !PyList_CheckExact(parent) || PyList_GET_SIZE(parent) != NFIELDS) {
        Py_XDECREF(parent);
        return Py_NewRef(self); /* outside any trace: nothing to do */
    }
    PyObject *trace = PyList_GET_ITEM(parent, TRACE);
    if (trace == Py_None) {
        Py_DECREF(parent);
        return Py_NewRef(self);
    }
    Py_INCREF(trace);
    PyObject *span = NULL, *spans = NULL, *token = NULL;
    PyObject *start = mark(trace);
    if (start == NULL)
        goto fail;
    span = PyList_New(NFIELDS);
    if (span == NULL) {
        Py_DECREF(start);
        goto fail;
    }
    PyList_SET_ITEM(span, NAME, Py_NewRef(self->name));
    PyList_SET_ITEM(span, START, start);
    PyList_SET_ITEM(span, END, Py_NewRef(Py_None));
    PyList_SET_ITEM(span, PARENT, Py_NewRef(parent));
    PyList_SET_ITEM(span, TRACE, Py_NewRef(trace));
    PyList_SET_ITEM(span, TOKEN, Py_NewRef(Py_None));
    PyList_SET_ITEM(span, CHILD, Py_NewRef(zero));
    spans = PyObject_GetAttr(trace, str_spans);
    if (spans == NULL || PyList_Append(spans, span) < 0)
        goto fail;
    token = PyContextVar_Set(current_var, span);
    if (token == NULL)
        goto fail;
    PyList_SetItem(span, TOKEN, token); /* steals token, releases the None */
    Py_DECREF(spans);
    Py_DECREF(span);
    Py_DECREF(trace);
    Py_DECREF(parent);
    return Py_NewRef(self);
fail:
    Py_XDECREF(spans);
    Py_XDECREF(span);
    Py_DECREF(trace);
    Py_DECREF(parent);
    return NULL;
}

static PyObject *
stage_exit(StageBase *self, PyObject *const *Py_UNUSED(args), Py_ssize_t Py_UNUSED(nargs))
{
    PyObject *span = NULL;
    if (current_var == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "servescope._speedups.setup() was not called");
        return NULL;
    }
    if (PyContextVar_Get(current_var, NULL, &span) < 0)
        return NULL;
    if (span != NULL && PyList_CheckExact(span) && PyList_GET_SIZE(span) == NFIELDS &&
        PyList_GET_ITEM(span, NAME) == self->name) {
        PyObject *trace = PyList_GET_ITEM(span, TRACE);
        Py_INCREF(trace);
        PyObject *end = mark(trace);
        Py_DECREF(trace);
        if (end == NULL) {
            Py_DECREF(span);
            return NULL;
        }
        PyList_SetItem(span, END, end); /* steals end */
        if (PyContextVar_Reset(current_var, PyList_GET_ITEM(span, TOKEN)) < 0) {
            Py_DECREF(span);
            return NULL;
        }
    }
    Py_XDECREF(span);
    Py_RETURN_NONE;
}

static int
stage_traverse(StageBase *self, visitproc visit, void *arg)
{
    Py_VISIT(self->name);
    return 0;
}

static int
stage_clear(StageBase *self)
{
    Py_CLEAR(self->name);
    return 0;
}

static void
stage_dealloc(StageBase *self)
{
    PyObject_GC_UnTrack(self);
    stage_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef stage_methods[] = {
    {"__enter__", (PyCFunction)stage_enter, METH_NOARGS, "Open this stage in the current trace."},
    {"__exit__", (PyCFunction)(void (*)(void))stage_exit, METH_FASTCALL, "Close this stage."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef stage_members[] = {
    {"name", T_OBJECT_EX, offsetof(StageBase, name), 0, "the stage's name"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject StageBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "servescope._speedups.StageBase",
    .tp_basicsize = sizeof(StageBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A stage's enter and exit in C (servescope.timing.Stage builds on it).",
    .tp_traverse = (traverseproc)stage_traverse,
    .tp_clear = (inquiry)stage_clear,
    .tp_dealloc = (destructor)stage_dealloc,
    .tp_methods = stage_methods,
    .tp_members = stage_members,
    .tp_new = PyType_GenericNew,
};

/* self_times(spans, root, release=True) -> (stage -> self ns, ns the top-level stages cover,
 * closed count) for wall-clock marks (ints), at the end of a request (or mid-request for a
 * header, release=False): timing.Trace._self_times' loop, walking
 * the spans backwards so that a span's children are summed before it. Child sums live in a
 * small table keyed by span (not in the span lists), self times in one keyed by name object,
 * folded into the dict once at the end; with release, each closed span drops its reference to
 * the trace. Nothing in the spans is written otherwise, so it may run any number of times. */
typedef struct {
    PyObject *key;
    long long value;
} Slot;

typedef struct {
    Slot *slots;
    size_t mask;
} Table;

#define SMALL 64 /* slots on the stack: traces of up to 31 spans allocate nothing */

static int
table_init(Table *t, Py_ssize_t n, Slot *small)
{
    size_t size = 16;
    while (size < (size_t)n * 2 + 2)
        size <<= 1;
    if (size <= SMALL) {
        memset(small, 0, size * sizeof(Slot));
        t->slots = small;
    }
    else {
        t->slots = PyMem_Calloc(size, sizeof(Slot));
    }
    t->mask = size - 1;
    return t->slots == NULL ? -1 : 0;
}

static void
table_free(Table *t, Slot *small)
{
    if (t->slots != small)
        PyMem_Free(t->slots);
}

static Slot *
table_slot(Table *t, PyObject *key)
{
    size_t i = ((size_t)key >> 4) & t->mask;
    while (t->slots[i].key != NULL && t->slots[i].key != key)
        i = (i + 1) & t->mask;
    t->slots[i].key = key;
    return &t->slots[i];
}

static PyObject *
self_times(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || nargs > 3 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "self_times(spans, root, release=True) takes two lists");
        return NULL;
    }
    PyObject *spans = args[0], *root = args[1];
    int release = nargs < 3 ? 1 : PyObject_IsTrue(args[2]);
    if (release < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(spans);
    Slot child_small[SMALL], own_small[SMALL];
    Table child = {NULL, 0}, own = {NULL, 0};
    PyObject *out = NULL;
    if (table_init(&child, n + 1, child_small) < 0 || table_init(&own, n, own_small) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t closed = 0;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        PyObject *sp = PyList_GET_ITEM(spans, i);
        if (!PyList_CheckExact(sp) || PyList_GET_SIZE(sp) != NFIELDS) {
            PyErr_SetString(PyExc_TypeError, "self_times() takes span lists");
            goto done;
        }
        PyObject *end = PyList_GET_ITEM(sp, END);
        if (end == Py_None)
            continue;
        closed++;
        long long d = PyLong_AsLongLong(end) - PyLong_AsLongLong(PyList_GET_ITEM(sp, START));
        if (PyErr_Occurred())
            goto done;
        if (d < 0)
            d = 0;
        long long mine = d - table_slot(&child, sp)->value; /* its children came later: done */
        table_slot(&child, PyList_GET_ITEM(sp, PARENT))->value += d;
        table_slot(&own, PyList_GET_ITEM(sp, NAME))->value += mine > 0 ? mine : 0;
        if (release && PyList_SetItem(sp, TRACE, Py_NewRef(Py_None)) < 0)
            goto done;
    }
    out = PyDict_New();
    if (out == NULL)
        goto done;
    for (size_t i = 0; i <= own.mask; i++) { /* equal names held by different objects add up */
        PyObject *name = own.slots[i].key;
        if (name == NULL)
            continue;
        long long sum = own.slots[i].value;
        PyObject *cur = PyDict_GetItemWithError(out, name);
        if (cur == NULL && PyErr_Occurred())
            goto fail;
        if (cur != NULL) {
            sum += PyLong_AsLongLong(cur);
            if (PyErr_Occurred())
                goto fail;
        }
        PyObject *v = PyLong_FromLongLong(sum);
        if (v == NULL || PyDict_SetItem(out, name, v) < 0) {
            Py_XDECREF(v);
            goto fail;
        }
        Py_DECREF(v);
    }
    PyObject *result = Py_BuildValue("(NLn)", out, table_slot(&child, root)->value, closed);
    out = NULL;
    table_free(&child, child_small);
    table_free(&own, own_small);
    return result;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(out);
    if (child.slots != NULL)
        table_free(&child, child_small);
    if (own.slots != NULL)
        table_free(&own, own_small);
    return NULL;
}

/* stage(name): timing.stage's lookup (a hit is one dict read); anything else goes to
 * timing._new_stage, which validates the name and caches the new Stage. */
static PyObject *stage_cache = NULL; /* timing._STAGES */
static PyObject *stage_factory = NULL; /* timing._new_stage */

static PyObject *
stage(PyObject *Py_UNUSED(module), PyObject *name)
{
    if (stage_cache == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "servescope._speedups.stage_setup() was not called");
        return NULL;
    }
    if (PyUnicode_CheckExact(name)) {
        PyObject *s = PyDict_GetItemWithError(stage_cache, name);
        if (s != NULL)
            return Py_NewRef(s);
        if (PyErr_Occurred())
            return NULL;
    }
    return PyObject_CallOneArg(stage_factory, name);
}

static PyObject *
stage_setup(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *cache, *factory;
    if (!PyArg_ParseTuple(args, "O!O", &PyDict_Type, &cache, &factory))
        return NULL;
    Py_XSETREF(stage_cache, Py_NewRef(cache));
    Py_XSETREF(stage_factory, Py_NewRef(factory));
    Py_RETURN_NONE;
}

static PyObject *
setup(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *var, *wall;
    if (!PyArg_ParseTuple(args, "OO", &var, &wall))
        return NULL;
    if (!PyContextVar_CheckExact(var)) {
        PyErr_SetString(PyExc_TypeError, "setup() takes the ContextVar of the current span");
        return NULL;
    }
    Py_XSETREF(current_var, Py_NewRef(var));
    Py_XSETREF(wall_mark, Py_NewRef(wall));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"setup", setup, METH_VARARGS, "setup(current_span_var, perf_counter_ns): bind to timing.py's state."},
    {"stage", stage, METH_O,
     "stage(name)\n--\n\n"
     "Time a block or a function as one stage of the current request.\n\n"
     "    with servescope.stage(\"infer\"):\n"
     "        y = model(x)\n\n"
     "    @servescope.stage(\"preprocess\")\n"
     "    async def prepare(payload): ...\n\n"
     "Outside a trace it records nothing and never fails. Stage objects hold no state (the\n"
     "open span lives in the context), so one may be shared, nested and used from many tasks."},
    {"stage_setup", stage_setup, METH_VARARGS, "stage_setup(cache, factory): bind to timing.py's stage cache."},
    {"self_times", (PyCFunction)(void (*)(void))self_times, METH_FASTCALL, "self_times(spans, root, release=True): stage self times of a wall-clock trace."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "servescope._speedups", "A stage's enter and exit in C.", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&StageBaseType) < 0)
        return NULL;
    str_mark = PyUnicode_InternFromString("_mark");
    str_spans = PyUnicode_InternFromString("_spans");
    zero = PyLong_FromLong(0);
    if (str_mark == NULL || str_spans == NULL || zero == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "StageBase", (PyObject *)&StageBaseType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
