/* servescope._speedups: the per-request hot path in C.
 *
 * A stage's enter and exit (StageBase), a trace's life (TraceBase), the end-of-request
 * self-time pass (self_times) and the recorder's fold into columns (fold_rows). Each export
 * has a pure-Python twin of the same name in _speedups_py.py that stays the reference and the
 * fallback (tests/conftest.py's `speedups` fixture runs the tests over both), and works on the
 * same data: a span is the list [name, start, end, parent, trace, token,
 * child_ns] and the current span lives in the same ContextVar. What C saves is the
 * interpreter's frames and attribute lookups; the clock is the trace's own `_mark`, except
 * that on Linux the wall clock (time.perf_counter_ns, which is CLOCK_MONOTONIC there) is read
 * directly.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>
#include <time.h>

enum { NAME, START, END, PARENT, TRACE, TOKEN, CHILD, NFIELDS };

/* ns marks are two-digit ints: PyLong_AsLong reads those directly where long is 64-bit
 * (PyLong_AsLongLong takes a byte-array detour in CPython 3.11) */
#if LONG_MAX >= LLONG_MAX
#define AS_NS(o) ((long long)PyLong_AsLong(o))
#else
#define AS_NS(o) PyLong_AsLongLong(o)
#endif

static PyObject *current_var = NULL; /* timing._current */
static PyObject *wall_mark = NULL;   /* time.perf_counter_ns */
static PyObject *str_mark = NULL;    /* "_mark" */
static PyObject *str_spans = NULL;   /* "_spans" */
static PyObject *zero = NULL;

typedef struct {
    PyObject_HEAD
    PyObject *name;
} StageBase;

/* A trace's state: the fields of _speedups_py.TraceBase's __slots__, read by C directly. */
typedef struct {
    PyObject_HEAD
    PyObject *clock;
    PyObject *recorder;
    PyObject *mark;
    PyObject *spans;
    PyObject *root;
    PyObject *token;
    PyObject *added;
    PyObject *durations_ns;
    PyObject *total_ns;
    PyObject *error;
    PyObject *start_time;
    Py_ssize_t open_stages;
    char summed;
    char wall; /* clock.name == "wall": marks are integer ns */
} TraceBase;

static PyTypeObject TraceBaseType;

#define IS_TRACE(o) PyObject_TypeCheck((o), &TraceBaseType)

static PyObject *
mark(PyObject *trace)
{
    PyObject *fn;
    if (IS_TRACE(trace) && ((TraceBase *)trace)->mark != NULL)
        fn = Py_NewRef(((TraceBase *)trace)->mark);
    else
        fn = PyObject_GetAttr(trace, str_mark);
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
    if (IS_TRACE(trace) && ((TraceBase *)trace)->spans != NULL)
        spans = Py_NewRef(((TraceBase *)trace)->spans);
    else
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
 * header, release=False): _speedups_py.self_times, walking
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

/* stage -> self ns of the closed spans (a new dict); *covered: ns the top-level stages cover;
 * *closed: how many spans are closed. */
static PyObject *
self_times_impl(PyObject *spans, PyObject *root, int release, long long *covered, Py_ssize_t *closed)
{
    Py_ssize_t n = PyList_GET_SIZE(spans);
    Slot child_small[SMALL], own_small[SMALL];
    Table child = {NULL, 0}, own = {NULL, 0};
    PyObject *out = NULL;
    if (table_init(&child, n + 1, child_small) < 0 || table_init(&own, n, own_small) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    *closed = 0;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        PyObject *sp = PyList_GET_ITEM(spans, i);
        if (!PyList_CheckExact(sp) || PyList_GET_SIZE(sp) != NFIELDS) {
            PyErr_SetString(PyExc_TypeError, "self_times() takes span lists");
            goto done;
        }
        PyObject *end = PyList_GET_ITEM(sp, END);
        if (end == Py_None)
            continue;
        (*closed)++;
        long long d = AS_NS(end) - AS_NS(PyList_GET_ITEM(sp, START));
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
            sum += AS_NS(cur);
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
    *covered = table_slot(&child, root)->value;
    goto done;
fail:
    Py_CLEAR(out);
done:
    if (child.slots != NULL)
        table_free(&child, child_small);
    if (own.slots != NULL)
        table_free(&own, own_small);
    return out;
}

static PyObject *
self_times(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || nargs > 3 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "self_times(spans, root, release=True) takes two lists");
        return NULL;
    }
    int release = nargs < 3 ? 1 : PyObject_IsTrue(args[2]);
    if (release < 0)
        return NULL;
    long long covered = 0;
    Py_ssize_t closed = 0;
    PyObject *out = self_times_impl(args[0], args[1], release, &covered, &closed);
    if (out == NULL)
        return NULL;
    return Py_BuildValue("(NLn)", out, covered, closed);
}

/* ---- TraceBase: a trace's life (_speedups_py.TraceBase in C) -------------------------------
 * __init__, start/__enter__, stop, __exit__ and detach. stop handles the wall-clock case (marks
 * are integer ns) with no stages added by hand and no header summed before; anything else goes
 * to the reference, _speedups_py.TraceBase.stop, which works on the same fields. */
static PyObject *wall_clock = NULL;    /* clocks._WALL */
static PyObject *resolve_clock = NULL; /* clocks.resolve_clock */
static PyObject *time_time = NULL;     /* time.time */
static PyObject *config_error = NULL;  /* exceptions.ConfigError */
static PyObject *py_stop = NULL;       /* _speedups_py.TraceBase.stop */
static PyObject *str_auto = NULL, *str_other = NULL, *str_torch = NULL, *str_record = NULL;
static PyObject *str_name = NULL, *str_wall = NULL, *str_mark_attr = NULL;
static PyObject *str_torch_cuda = NULL, *str_initialized = NULL;

static int
trace_init(TraceBase *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"cuda", "clock", "recorder", NULL};
    PyObject *cuda = str_auto, *clock = Py_None, *recorder = Py_None;
    if (wall_clock == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "servescope._speedups.trace_setup() was not called");
        return -1;
    }
    if ((PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) &&
        !PyArg_ParseTupleAndKeywords(args, kwds, "|$OOO:trace", kwlist, &cuda, &clock, &recorder))
        return -1;
    if (clock == Py_None) {
        int is_auto = cuda == str_auto || (PyUnicode_Check(cuda) && PyUnicode_Compare(cuda, str_auto) == 0);
        PyObject *torch = NULL;
        if (is_auto) { /* the common CPU case, decided without a call */
            PyObject *modules = PyImport_GetModuleDict();
            torch = PyDict_GetItemWithError(modules, str_torch);
            if (torch == NULL && PyErr_Occurred())
                return -1;
            PyObject *torch_cuda = torch == NULL ? NULL : PyDict_GetItemWithError(modules, str_torch_cuda);
            if (torch_cuda == NULL && PyErr_Occurred())
                return -1;
            if (torch_cuda != NULL) { /* torch imported, CUDA never initialised: clocks._cuda_initialized's shortcut */
                PyObject *flag = PyObject_GetAttr(torch_cuda, str_initialized);
                if (flag == NULL)
                    PyErr_Clear();
                else if (flag == Py_False)
                    torch = NULL;
                Py_XDECREF(flag);
            }
        }
        if (is_auto && torch == NULL)
            clock = Py_NewRef(wall_clock);
        else
            clock = PyObject_CallFunctionObjArgs(resolve_clock, cuda, Py_None, NULL);
    }
    else {
        Py_INCREF(clock);
    }
    if (clock == NULL)
        return -1;
    PyObject *fn, *name;
    if (clock == wall_clock) { /* its mark is perf_counter_ns */
        fn = Py_NewRef(wall_mark);
        name = Py_NewRef(str_wall);
    }
    else {
        fn = PyObject_GetAttr(clock, str_mark_attr);
        name = fn == NULL ? NULL : PyObject_GetAttr(clock, str_name);
    }
    PyObject *spans = PyList_New(0), *added = PyList_New(0), *durations = PyDict_New();
    if (fn == NULL || name == NULL || spans == NULL || added == NULL || durations == NULL) {
        Py_DECREF(clock);
        Py_XDECREF(fn);
        Py_XDECREF(name);
        Py_XDECREF(spans);
        Py_XDECREF(added);
        Py_XDECREF(durations);
        return -1;
    }
    int wall = name == str_wall || (PyUnicode_Check(name) && PyUnicode_Compare(name, str_wall) == 0);
    Py_DECREF(name);
    Py_XSETREF(self->clock, clock);
    Py_XSETREF(self->recorder, Py_NewRef(recorder));
    Py_XSETREF(self->mark, fn);
    Py_XSETREF(self->spans, spans);
    Py_XSETREF(self->root, Py_NewRef(Py_None));
    Py_XSETREF(self->token, Py_NewRef(Py_None));
    Py_XSETREF(self->added, added);
    Py_XSETREF(self->durations_ns, durations);
    Py_XSETREF(self->total_ns, Py_NewRef(Py_None));
    Py_XSETREF(self->error, Py_NewRef(Py_None));
    Py_XSETREF(self->start_time, Py_NewRef(Py_None));
    self->open_stages = 0;
    self->summed = 0;
    self->wall = (char)wall;
    return 0;
}

static PyObject *
trace_start(TraceBase *self, PyObject *Py_UNUSED(ignored))
{
    if (self->mark == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "servescope.trace was not initialised");
        return NULL;
    }
    if (self->root != NULL && self->root != Py_None) {
        PyErr_SetString(config_error, "this trace was already started: open a new servescope.trace() per request");
        return NULL;
    }
    PyObject *now = PyObject_CallNoArgs(time_time);
    if (now == NULL)
        return NULL;
    Py_XSETREF(self->start_time, now);
    PyObject *start = mark((PyObject *)self);
    if (start == NULL)
        return NULL;
    PyObject *root = PyList_New(NFIELDS);
    if (root == NULL) {
        Py_DECREF(start);
        return NULL;
    }
    PyList_SET_ITEM(root, NAME, Py_NewRef(Py_None));
    PyList_SET_ITEM(root, START, start);
    PyList_SET_ITEM(root, END, Py_NewRef(Py_None));
    PyList_SET_ITEM(root, PARENT, Py_NewRef(Py_None));
    PyList_SET_ITEM(root, TRACE, Py_NewRef(self));
    PyList_SET_ITEM(root, TOKEN, Py_NewRef(Py_None));
    PyList_SET_ITEM(root, CHILD, Py_NewRef(zero));
    PyObject *token = PyContextVar_Set(current_var, root);
    if (token == NULL) {
        Py_DECREF(root);
        return NULL;
    }
    Py_XSETREF(self->root, root);
    Py_XSETREF(self->token, token);
    return Py_NewRef(self);
}

static PyObject *
error_text(PyObject *error)
{
    PyObject *type_name = PyObject_GetAttrString((PyObject *)Py_TYPE(error), "__name__");
    if (type_name == NULL)
        return NULL;
    PyObject *text = PyUnicode_FromFormat("%U: %S", type_name, error);
    Py_DECREF(type_name);
    return text;
}

/* stop(error=None): the reference is _speedups_py.TraceBase.stop */
static PyObject *
trace_stop_impl(TraceBase *self, PyObject *error)
{
    PyObject *root = self->root;
    if (root == NULL || root == Py_None) {
        PyErr_SetString(config_error, "this trace was never started: use `with servescope.trace():`");
        return NULL;
    }
    if (!PyList_CheckExact(root) || PyList_GET_SIZE(root) != NFIELDS || !self->wall || self->summed ||
        self->added == NULL || !PyList_CheckExact(self->added) || PyList_GET_SIZE(self->added) != 0 ||
        self->spans == NULL || !PyList_CheckExact(self->spans))
        return PyObject_CallFunctionObjArgs(py_stop, (PyObject *)self, error, NULL);
    if (PyList_GET_ITEM(root, END) != Py_None)
        return Py_NewRef(self);
    Py_INCREF(root); /* held: an error's __str__ below is Python code */
    PyObject *out = NULL, *result = NULL;
    PyObject *end = mark((PyObject *)self);
    if (end == NULL)
        goto done;
    long long total = AS_NS(end) - AS_NS(PyList_GET_ITEM(root, START));
    PyList_SetItem(root, END, end); /* steals end */
    if (PyErr_Occurred())
        goto done;
    if (total < 0)
        total = 0;
    if (error != Py_None && self->error == Py_None) {
        PyObject *text = error_text(error);
        if (text == NULL)
            goto done;
        Py_SETREF(self->error, text);
    }
    long long covered = 0;
    Py_ssize_t closed = 0;
    out = self_times_impl(self->spans, root, 1, &covered, &closed);
    if (out == NULL)
        goto done;
    PyObject *total_obj = PyLong_FromLongLong(total);
    if (total_obj == NULL)
        goto done;
    Py_XSETREF(self->total_ns, total_obj);
    if (total > covered) { /* time in no stage */
        PyObject *other = PyLong_FromLongLong(total - covered);
        if (other == NULL || PyDict_SetItem(out, str_other, other) < 0) {
            Py_XDECREF(other);
            goto done;
        }
        Py_DECREF(other);
    }
    self->open_stages = PyList_GET_SIZE(self->spans) - closed;
    Py_XSETREF(self->durations_ns, out);
    out = NULL;
    if (self->token == NULL || self->token == Py_None) /* break the trace <-> root cycle */
        PyList_SetItem(root, TRACE, Py_NewRef(Py_None));
    if (self->recorder != NULL && self->recorder != Py_None) {
        PyObject *r = PyObject_CallMethodOneArg(self->recorder, str_record, (PyObject *)self);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    result = Py_NewRef(self);
done:
    Py_XDECREF(out);
    Py_DECREF(root);
    return result;
}

static PyObject *
trace_stop(TraceBase *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *error = Py_None;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        if (nargs != 0 || PyTuple_GET_SIZE(kwnames) != 1 ||
            PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "error") != 0) {
            PyErr_SetString(PyExc_TypeError, "stop() takes one argument, error");
            return NULL;
        }
        error = args[0];
    }
    else if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "stop() takes one argument, error");
        return NULL;
    }
    else if (nargs == 1) {
        error = args[0];
    }
    return trace_stop_impl(self, error);
}

static int
trace_detach_impl(TraceBase *self)
{
    PyObject *token = self->token;
    if (token == NULL || token == Py_None)
        return 0;
    self->token = Py_NewRef(Py_None);
    int rc = PyContextVar_Reset(current_var, token);
    Py_DECREF(token);
    if (rc < 0) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError)) /* another context holds its own value */
            return -1;
        PyErr_Clear();
    }
    PyObject *root = self->root;
    if (root != NULL && root != Py_None && PyList_GET_ITEM(root, END) != Py_None)
        PyList_SetItem(root, TRACE, Py_NewRef(Py_None));
    return 0;
}

static PyObject *
trace_detach(TraceBase *self, PyObject *Py_UNUSED(ignored))
{
    if (trace_detach_impl(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
trace_exit(TraceBase *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *r = trace_stop_impl(self, nargs > 1 ? args[1] : Py_None);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    if (trace_detach_impl(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int
trace_traverse(TraceBase *self, visitproc visit, void *arg)
{
    Py_VISIT(self->clock);
    Py_VISIT(self->recorder);
    Py_VISIT(self->mark);
    Py_VISIT(self->spans);
    Py_VISIT(self->root);
    Py_VISIT(self->token);
    Py_VISIT(self->added);
    Py_VISIT(self->durations_ns);
    Py_VISIT(self->total_ns);
    Py_VISIT(self->error);
    Py_VISIT(self->start_time);
    return 0;
}

static int
trace_clear(TraceBase *self)
{
    Py_CLEAR(self->clock);
    Py_CLEAR(self->recorder);
    Py_CLEAR(self->mark);
    Py_CLEAR(self->spans);
    Py_CLEAR(self->root);
    Py_CLEAR(self->token);
    Py_CLEAR(self->added);
    Py_CLEAR(self->durations_ns);
    Py_CLEAR(self->total_ns);
    Py_CLEAR(self->error);
    Py_CLEAR(self->start_time);
    return 0;
}

static void
trace_dealloc(TraceBase *self)
{
    PyObject_GC_UnTrack(self);
    trace_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef trace_methods[] = {
    {"start", (PyCFunction)trace_start, METH_NOARGS, "Open the trace in the current context (``with`` does this for you)."},
    {"__enter__", (PyCFunction)trace_start, METH_NOARGS, "Open the trace in the current context."},
    {"stop", (PyCFunction)(void (*)(void))trace_stop, METH_FASTCALL | METH_KEYWORDS,
     "stop(error=None)\n--\n\n"
     "End the request's clock now (its response is out), resolve, and hand it to the recorder.\n\n"
     "The trace stays attached to its context until ``detach()``; ``finish()`` does both."},
    {"detach", (PyCFunction)trace_detach, METH_NOARGS, "Stop stages opened later in this context from landing in this trace."},
    {"__exit__", (PyCFunction)(void (*)(void))trace_exit, METH_FASTCALL, "Close the trace: stop, then detach."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef trace_members[] = {
    {"clock", T_OBJECT, offsetof(TraceBase, clock), 0, "the clock marks are read from"},
    {"recorder", T_OBJECT, offsetof(TraceBase, recorder), 0, "where the finished trace goes (or None)"},
    {"_mark", T_OBJECT, offsetof(TraceBase, mark), 0, NULL},
    {"_spans", T_OBJECT, offsetof(TraceBase, spans), 0, NULL},
    {"_root", T_OBJECT, offsetof(TraceBase, root), 0, NULL},
    {"_token", T_OBJECT, offsetof(TraceBase, token), 0, NULL},
    {"_added", T_OBJECT, offsetof(TraceBase, added), 0, NULL},
    {"durations_ns", T_OBJECT, offsetof(TraceBase, durations_ns), 0, "stage -> self time in ns"},
    {"total_ns", T_OBJECT, offsetof(TraceBase, total_ns), 0, "the request's time in ns (None while open)"},
    {"error", T_OBJECT, offsetof(TraceBase, error), 0, "\"TypeName: message\" for a failed request"},
    {"start_time", T_OBJECT, offsetof(TraceBase, start_time), 0, "when the trace started (epoch seconds)"},
    {"open_stages", T_PYSSIZET, offsetof(TraceBase, open_stages), 0, "stages still open when it stopped"},
    {"_summed", T_BOOL, offsetof(TraceBase, summed), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject TraceBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "servescope._speedups.TraceBase",
    .tp_basicsize = sizeof(TraceBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A trace's life in C (servescope.timing.Trace builds on it).",
    .tp_traverse = (traverseproc)trace_traverse,
    .tp_clear = (inquiry)trace_clear,
    .tp_dealloc = (destructor)trace_dealloc,
    .tp_methods = trace_methods,
    .tp_members = trace_members,
    .tp_init = (initproc)trace_init,
    .tp_new = PyType_GenericNew,
};

static PyObject *
trace_setup(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *wall, *resolve, *now, *cfg, *stop;
    if (!PyArg_ParseTuple(args, "OOOOO", &wall, &resolve, &now, &cfg, &stop))
        return NULL;
    Py_XSETREF(wall_clock, Py_NewRef(wall));
    Py_XSETREF(resolve_clock, Py_NewRef(resolve));
    Py_XSETREF(time_time, Py_NewRef(now));
    Py_XSETREF(config_error, Py_NewRef(cfg));
    Py_XSETREF(py_stop, Py_NewRef(stop));
    Py_RETURN_NONE;
}

/* ---- fold_rows: the recorder's rows into columns ------------------------------------------
 * fold_rows(rows) with rows [(durations_ns: dict, total_ns, error, start_time), ...] ->
 * (totals, groups, failed): totals the successful rows' totals in ms (float64 bytes), groups
 * [(stage names, float64 bytes: a row of ms per request, one column per name)] for each set of
 * stage names in dict order, failed [(total_ns, error)]. _speedups_py.fold_rows, without a
 * Python object per value. */
static int
as_ms(PyObject *v, double *out)
{
    if (PyLong_CheckExact(v)) {
        long long ns = AS_NS(v);
        if (ns == -1 && PyErr_Occurred())
            return -1;
        *out = (double)ns / 1e6;
        return 0;
    }
    double ns = PyFloat_AsDouble(v);
    if (ns == -1.0 && PyErr_Occurred())
        return -1;
    *out = ns / 1e6;
    return 0;
}

/* is the dict's key order exactly `keys`? */
static int
same_keys(PyObject *d, PyObject *keys)
{
    Py_ssize_t n = PyTuple_GET_SIZE(keys), pos = 0, i = 0;
    PyObject *k, *v;
    if (PyDict_GET_SIZE(d) != n)
        return 0;
    while (PyDict_Next(d, &pos, &k, &v)) {
        PyObject *want = PyTuple_GET_ITEM(keys, i++);
        if (k != want) {
            int eq = PyObject_RichCompareBool(k, want, Py_EQ);
            if (eq <= 0)
                return eq;
        }
    }
    return 1;
}

static PyObject *
fold_rows(PyObject *Py_UNUSED(module), PyObject *rows)
{
    if (!PyList_CheckExact(rows)) {
        PyErr_SetString(PyExc_TypeError, "fold_rows() takes a list of rows");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(rows), ok = 0;
    Py_ssize_t *gid = PyMem_Malloc(sizeof(Py_ssize_t) * (n ? n : 1));
    PyObject *totals = PyBytes_FromStringAndSize(NULL, sizeof(double) * n);
    PyObject *index = PyDict_New();      /* stage names -> group number */
    PyObject *names = PyList_New(0);     /* group number -> stage names */
    PyObject *failed = PyList_New(0);
    PyObject *groups = NULL, *result = NULL;
    Py_ssize_t *counts = NULL, *fill = NULL;
    PyObject **bufs = NULL;
    if (gid == NULL || totals == NULL || index == NULL || names == NULL || failed == NULL) {
        if (gid == NULL)
            PyErr_NoMemory();
        goto done;
    }
    double *tot = (double *)PyBytes_AS_STRING(totals);
    PyObject *last = NULL; /* the previous row's stage names (borrowed from names) */
    Py_ssize_t last_gid = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 4 || !PyDict_CheckExact(PyTuple_GET_ITEM(row, 0))) {
            PyErr_SetString(PyExc_TypeError, "fold_rows() takes (durations dict, total, error, start) rows");
            goto done;
        }
        PyObject *durations = PyTuple_GET_ITEM(row, 0), *error = PyTuple_GET_ITEM(row, 2);
        gid[i] = -1;
        if (error != Py_None) {
            PyObject *pair = PyTuple_Pack(2, PyTuple_GET_ITEM(row, 1), error);
            if (pair == NULL || PyList_Append(failed, pair) < 0) {
                Py_XDECREF(pair);
                goto done;
            }
            Py_DECREF(pair);
            continue;
        }
        if (as_ms(PyTuple_GET_ITEM(row, 1), &tot[ok]) < 0)
            goto done;
        ok++;
        int same = last == NULL ? 0 : same_keys(durations, last);
        if (same < 0)
            goto done;
        if (!same) {
            PyObject *keys = PySequence_Tuple(durations);
            if (keys == NULL)
                goto done;
            PyObject *g = PyDict_GetItemWithError(index, keys);
            if (g == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(keys);
                    goto done;
                }
                g = PyLong_FromSsize_t(PyList_GET_SIZE(names));
                if (g == NULL || PyDict_SetItem(index, keys, g) < 0 || PyList_Append(names, keys) < 0) {
                    Py_XDECREF(g);
                    Py_DECREF(keys);
                    goto done;
                }
                Py_DECREF(g);
            }
            last_gid = PyLong_AsSsize_t(g);
            last = PyList_GET_ITEM(names, last_gid);
            Py_DECREF(keys);
        }
        gid[i] = last_gid;
    }
    Py_ssize_t ng = PyList_GET_SIZE(names);
    counts = PyMem_Calloc(ng ? ng : 1, sizeof(Py_ssize_t));
    fill = PyMem_Calloc(ng ? ng : 1, sizeof(Py_ssize_t));
    bufs = PyMem_Calloc(ng ? ng : 1, sizeof(PyObject *));
    if (counts == NULL || fill == NULL || bufs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (gid[i] >= 0)
            counts[gid[i]]++;
    for (Py_ssize_t g = 0; g < ng; g++) {
        Py_ssize_t k = PyTuple_GET_SIZE(PyList_GET_ITEM(names, g));
        bufs[g] = PyBytes_FromStringAndSize(NULL, sizeof(double) * k * counts[g]);
        if (bufs[g] == NULL)
            goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (gid[i] < 0)
            continue;
        PyObject *durations = PyTuple_GET_ITEM(PyList_GET_ITEM(rows, i), 0);
        double *out = (double *)PyBytes_AS_STRING(bufs[gid[i]]) + fill[gid[i]];
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(durations, &pos, &k, &v))
            if (as_ms(v, out++) < 0)
                goto done;
        fill[gid[i]] += PyDict_GET_SIZE(durations);
    }
    groups = PyList_New(ng);
    if (groups == NULL)
        goto done;
    for (Py_ssize_t g = 0; g < ng; g++) {
        PyObject *pair = PyTuple_Pack(2, PyList_GET_ITEM(names, g), bufs[g]);
        if (pair == NULL)
            goto done;
        PyList_SET_ITEM(groups, g, pair);
    }
    if (_PyBytes_Resize(&totals, sizeof(double) * ok) < 0)
        goto done;
    result = PyTuple_Pack(3, totals, groups, failed);
done:
    if (bufs != NULL)
        for (Py_ssize_t g = 0; g < PyList_GET_SIZE(names); g++)
            Py_XDECREF(bufs[g]);
    PyMem_Free(bufs);
    PyMem_Free(counts);
    PyMem_Free(fill);
    PyMem_Free(gid);
    Py_XDECREF(totals);
    Py_XDECREF(index);
    Py_XDECREF(names);
    Py_XDECREF(failed);
    Py_XDECREF(groups);
    return result;
}

/* stage(name): timing.stage's lookup (a hit is one dict read); anything else goes to the
 * factory from timing._stage_maker, which validates the name and caches the new Stage. */
static PyObject *stage_cache = NULL; /* timing._STAGES */
static PyObject *stage_factory = NULL; /* timing._stage_maker(Stage, _STAGES) */

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
    {"trace_setup", trace_setup, METH_VARARGS,
     "trace_setup(wall_clock, resolve_clock, time, ConfigError, reference_stop): bind to timing.py."},
    {"fold_rows", fold_rows, METH_O, "fold_rows(rows) -> (totals, groups, failed): a recorder's rows as float64 ms columns."},
    {"self_times", (PyCFunction)(void (*)(void))self_times, METH_FASTCALL, "self_times(spans, root, release=True): stage self times of a wall-clock trace."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "servescope._speedups", "A stage's enter and exit, and a trace's life, in C.", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&StageBaseType) < 0 || PyType_Ready(&TraceBaseType) < 0)
        return NULL;
    str_mark = PyUnicode_InternFromString("_mark");
    str_spans = PyUnicode_InternFromString("_spans");
    str_auto = PyUnicode_InternFromString("auto");
    str_other = PyUnicode_InternFromString("other");
    str_torch = PyUnicode_InternFromString("torch");
    str_record = PyUnicode_InternFromString("record");
    str_name = PyUnicode_InternFromString("name");
    str_wall = PyUnicode_InternFromString("wall");
    str_mark_attr = PyUnicode_InternFromString("mark");
    str_torch_cuda = PyUnicode_InternFromString("torch.cuda");
    str_initialized = PyUnicode_InternFromString("_initialized");
    zero = PyLong_FromLong(0);
    if (str_mark == NULL || str_spans == NULL || str_auto == NULL || str_other == NULL || str_torch == NULL ||
        str_record == NULL || str_name == NULL || str_wall == NULL || str_mark_attr == NULL || str_torch_cuda == NULL ||
        str_initialized == NULL || zero == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "StageBase", (PyObject *)&StageBaseType) < 0 ||
        PyModule_AddObjectRef(m, "TraceBase", (PyObject *)&TraceBaseType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
