// Test hooks, never in the product: ParameterManagerForTest (the tuning state machine driven
// with synthetic step timings), autotune_maximize (the GP/EI optimizer against a Python
// objective) and gp_fit_predict (Gaussian-process regression), for tests/unit/
// test_autotune_manager.py and test_autotune_math.py. Built into _testhooks by
// tests/native/build.py; the module's thread (the GIL holder) calls them.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string>
#include <vector>

#include "autotune/bayesian_optimizer.h"
#include "autotune/gaussian_process.h"
#include "autotune/parameter_manager.h"
#include "bindings/timeline_autotune.h"
#include "testhooks/hooks.h"

namespace {

using hvd::autotune::AutotuneOptions;
using hvd::autotune::ParameterManager;
using hvd::autotune::Point;
using hvd::autotune::TunedParams;
using hvd::bindings::autotuneStateToDict;
using hvd::testhooks::toDoubles;
using hvd::bindings::tunedParamsToDict;

bool toPoints(PyObject* seq, std::vector<Point>* out, const char* what) {
  PyObject* fast = PySequence_Fast(seq, what);
  if (fast == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  out->resize(n);
  bool ok = true;
  for (Py_ssize_t i = 0; i < n && ok; ++i) {
    ok = toDoubles(PySequence_Fast_GET_ITEM(fast, i), &(*out)[i], what);
  }
  Py_DECREF(fast);
  return ok;
}

PyObject* toList(const std::vector<double>& v) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(v.size()));
  for (size_t i = 0; list != nullptr && i < v.size(); ++i) {
    PyList_SET_ITEM(list, i, PyFloat_FromDouble(v[i]));
  }
  return list;
}

bool parseKernel(const char* name, hvd::autotune::Kernel* kernel) {
  const std::string k = name == nullptr ? "matern52" : name;
  if (k == "matern52") *kernel = hvd::autotune::Kernel::kMatern52;
  else if (k == "rbf") *kernel = hvd::autotune::Kernel::kRbf;
  else PyErr_Format(PyExc_ValueError, "kernel must be 'matern52' or 'rbf', got '%s'", k.c_str());
  return k == "matern52" || k == "rbf";
}

// ---- ParameterManagerForTest ----------------------------------------------------------------

struct ManagerObject {
  PyObject_HEAD
  ParameterManager* manager;
};

ParameterManager& managerOf(PyObject* self) {
  return *reinterpret_cast<ManagerObject*>(self)->manager;
}

PyObject* managerNew(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {
      "fusion_threshold_bytes", "cycle_time_ms", "cache_enabled", "hierarchical_allreduce",
      "warmup_samples", "steps_per_sample", "samples_per_setting", "bayes_max_samples",
      "gp_noise", "seed", "log_path", "num_hosts", "fusion_max_bytes", "cycle_min_ms",
      "cycle_max_ms", "fixed_fusion_threshold", "fixed_cycle_time", "fixed_cache",
      "fixed_hierarchical", "finalists", nullptr};
  TunedParams p;
  AutotuneOptions o;
  int cache = p.cache_enabled, hier = p.hierarchical_allreduce;
  int fixed[4] = {0, 0, 0, 0};
  const char* log = nullptr;
  long long fusion = p.fusion_threshold_bytes, fusion_max = o.fusion_max_bytes;
  unsigned long long seed = o.seed;
  if (!PyArg_ParseTupleAndKeywords(
          args, kwargs, "|$LdppiiiidKziLddppppi", const_cast<char**>(kw), &fusion,
          &p.cycle_time_ms, &cache, &hier, &o.warmup_samples, &o.steps_per_sample,
          &o.samples_per_setting, &o.bayes_max_samples, &o.gp_noise, &seed, &log, &o.num_hosts,
          &fusion_max, &o.cycle_min_ms, &o.cycle_max_ms, &fixed[0], &fixed[1], &fixed[2],
          &fixed[3], &o.finalists)) {
    return nullptr;
  }
  p.fusion_threshold_bytes = fusion;
  p.cache_enabled = cache != 0;
  p.hierarchical_allreduce = hier != 0;
  o.fusion_max_bytes = fusion_max;
  o.seed = seed;
  o.log_path = log == nullptr ? "" : log;
  o.fixed_fusion_threshold = fixed[0] != 0;
  o.fixed_cycle_time = fixed[1] != 0;
  o.fixed_cache = fixed[2] != 0;
  o.fixed_hierarchical = fixed[3] != 0;
  auto* self = reinterpret_cast<ManagerObject*>(type->tp_alloc(type, 0));
  if (self != nullptr) self->manager = new ParameterManager(p, o);
  return reinterpret_cast<PyObject*>(self);
}

void managerDealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  delete reinterpret_cast<ManagerObject*>(self)->manager;
  type->tp_free(self);
  Py_DECREF(type);
}

PyObject* managerUpdate(PyObject* self, PyObject* args) {
  long long bytes = 0;
  double seconds = 0.0;
  if (!PyArg_ParseTuple(args, "Ld", &bytes, &seconds)) return nullptr;
  return PyBool_FromLong(managerOf(self).update(bytes, seconds));
}

PyObject* managerParams(PyObject* self, PyObject*) {
  return tunedParamsToDict(managerOf(self).currentParams());
}

PyObject* managerState(PyObject* self, PyObject*) {
  return autotuneStateToDict(managerOf(self).state());
}

PyMethodDef g_manager_methods[] = {
    {"update", managerUpdate, METH_VARARGS, "update(bytes, seconds) -> True if params changed"},
    {"current_params", managerParams, METH_NOARGS, "current_params() -> dict"},
    {"state", managerState, METH_NOARGS, "state() -> dict"},
    {nullptr, nullptr, 0, nullptr}};

// ---- pure-math hooks ---------------------------------------------------------------------------

PyObject* autotuneMaximize(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"objective", "bounds", "max_samples", "noise", "seed", "kernel",
                             "recommend", nullptr};
  PyObject* objective = nullptr;
  PyObject* bounds = nullptr;
  int max_samples = 20;
  hvd::autotune::BayesOptions o;
  unsigned long long seed = o.seed;
  const char* kernel = nullptr;
  int recommend = 0;  // best = BayesianOptimizer::recommend() instead of the largest sample
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|idKzp", const_cast<char**>(kw), &objective,
                                   &bounds, &max_samples, &o.noise, &seed, &kernel,
                                   &recommend)) {
    return nullptr;
  }
  std::vector<Point> box;
  if (!parseKernel(kernel, &o.kernel) || !toPoints(bounds, &box, "bounds: [(lo, hi), ...]")) {
    return nullptr;
  }
  Point lower, upper;
  for (const Point& b : box) {
    if (b.size() != 2 || !(b[0] < b[1])) {
      return PyErr_Format(PyExc_ValueError,
                          "autotune_maximize: each bound must be (lo, hi) with lo < hi");
    }
    lower.push_back(b[0]);
    upper.push_back(b[1]);
  }
  o.seed = seed;
  hvd::autotune::BayesianOptimizer optimizer(lower, upper, o);
  PyObject* history = PyList_New(0);
  for (int i = 0; history != nullptr && i < max_samples; ++i) {
    const Point x = optimizer.nextSample();
    PyObject* py_x = toList(x);
    PyObject* call_args = py_x == nullptr ? nullptr : PyList_AsTuple(py_x);
    PyObject* value = call_args == nullptr ? nullptr : PyObject_CallObject(objective, call_args);
    const double y = value == nullptr ? -1.0 : PyFloat_AsDouble(value);
    Py_XDECREF(call_args);
    Py_XDECREF(value);
    PyObject* row = PyErr_Occurred() ? nullptr : Py_BuildValue("(Od)", py_x, y);
    Py_XDECREF(py_x);
    if (row == nullptr || PyList_Append(history, row) < 0) Py_CLEAR(history);
    Py_XDECREF(row);
    optimizer.addSample(x, y);
  }
  if (history == nullptr) return nullptr;
  Point best_x;
  double best_y = 0.0;
  optimizer.best(&best_x, &best_y);
  const int chosen = recommend ? optimizer.recommend() : -1;
  if (chosen >= 0) {
    PyObject* row = PyList_GetItem(history, chosen);  // borrowed: (x, y)
    return Py_BuildValue("(OdN)", PyTuple_GetItem(row, 0),
                         PyFloat_AsDouble(PyTuple_GetItem(row, 1)), history);
  }
  return Py_BuildValue("(NdN)", toList(best_x), best_y, history);
}

PyObject* gpFitPredict(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"x_train", "y_train", "x_query", "noise", "kernel", "fit_noise",
                             "seed", "length_scales", "signal_variance", nullptr};
  PyObject *x_train = nullptr, *y_train = nullptr, *x_query = nullptr, *lengths = Py_None;
  hvd::autotune::GpOptions o;
  int fit_noise = 1;
  unsigned long long seed = o.seed;
  const char* kernel = nullptr;
  double signal = 1.0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|dzpKOd", const_cast<char**>(kw), &x_train,
                                   &y_train, &x_query, &o.noise, &kernel, &fit_noise, &seed,
                                   &lengths, &signal)) {
    return nullptr;
  }
  std::vector<Point> xs, queries;
  std::vector<double> ys;
  hvd::autotune::GpHyper hyper;
  if (!parseKernel(kernel, &o.kernel) || !toPoints(x_train, &xs, "x_train: [[x, ...], ...]") ||
      !toDoubles(y_train, &ys, "y_train: [y, ...]") ||
      !toPoints(x_query, &queries, "x_query: [[x, ...], ...]") ||
      (lengths != Py_None && !toDoubles(lengths, &hyper.length_scales, "length_scales"))) {
    return nullptr;
  }
  o.fit_noise = fit_noise != 0;
  o.seed = seed;
  hyper.signal_variance = signal;
  hyper.noise_variance = o.noise;
  hvd::autotune::GaussianProcess gp(o);
  const hvd::common::Status status =
      lengths == Py_None ? gp.fit(xs, ys) : gp.fitWith(xs, ys, hyper);
  if (!status.isOk()) return PyErr_Format(PyExc_ValueError, "%s", status.message().c_str());
  std::vector<double> means(queries.size()), stds(queries.size());
  for (size_t i = 0; i < queries.size(); ++i) {
    if (queries[i].size() != xs.front().size()) {
      return PyErr_Format(PyExc_ValueError, "gp_fit_predict: query %zu has the wrong dimension", i);
    }
    gp.predict(queries[i], &means[i], &stds[i]);
  }
  const hvd::autotune::GpHyper& h = gp.hyper();
  return Py_BuildValue("(NN{s:N,s:d,s:d,s:d})", toList(means), toList(stds), "length_scales",
                       toList(h.length_scales), "signal_variance", h.signal_variance,
                       "noise_variance", h.noise_variance, "log_marginal_likelihood",
                       gp.logMarginalLikelihood());
}

PyMethodDef g_functions[] = {
    {"autotune_maximize",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(autotuneMaximize)),
     METH_VARARGS | METH_KEYWORDS,
     "autotune_maximize(objective, bounds, max_samples=20, noise=0.8, seed=1, kernel=None)\n"
     "-> (best_x, best_y, [(x, y), ...]): the autotuner's GP/EI optimizer on objective(*x)."},
    {"gp_fit_predict", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(gpFitPredict)),
     METH_VARARGS | METH_KEYWORDS,
     "gp_fit_predict(x_train, y_train, x_query, noise=0.8, kernel=None, fit_noise=True, seed=1,\n"
     "length_scales=None, signal_variance=1.0) -> (means, stds, hyper): GP regression."},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot g_manager_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(managerNew)},
    {Py_tp_dealloc, reinterpret_cast<void*>(managerDealloc)},
    {Py_tp_methods, g_manager_methods},
    {Py_tp_doc, const_cast<char*>("The autotuner's ParameterManager driven from Python.")},
    {0, nullptr}};

PyType_Spec g_manager_spec = {"_testhooks.ParameterManagerForTest",
                              sizeof(ManagerObject), 0, Py_TPFLAGS_DEFAULT, g_manager_slots};

}  // namespace

namespace hvd::testhooks {

int addAutotuneHooks(PyObject* module) {
  if (PyModule_AddFunctions(module, g_functions) < 0) return -1;
  PyObject* type = PyType_FromSpec(&g_manager_spec);
  if (type == nullptr) return -1;
  if (PyModule_AddObject(module, "ParameterManagerForTest", type) < 0) {
    Py_DECREF(type);
    return -1;
  }
  return 0;
}

}  // namespace hvd::testhooks
