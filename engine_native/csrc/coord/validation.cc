// Cross-rank checks for one name, in Horovod's order of concern: operation, data type, device,
// operation parameters, shapes, splits. Each message keeps Horovod's lead phrase ("Mismatched
// data types", "Mismatched ALLREDUCE tensor shapes", ...) and then names both ranks (global),
// both values and the tensor. requests[0] (the lowest submitting rank) is the reference.
#include "coord/validation.h"

#include <algorithm>
#include <limits>

#include "common/text.h"

namespace hvd::coord {

namespace {

template <typename Dims>
std::string shapeText(const Dims& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// Shortest text that still tells two different factors apart.
std::string factorText(double v, double other) {
  for (int digits = 6;; ++digits) {
    common::Text a, b;
    a.precision(digits);
    b.precision(digits);
    a << v;
    b << other;
    if (a.str() != b.str() || digits >= 17) return a.str();
  }
}

const char* deviceText(int32_t device) { return device < 0 ? "CPU" : "GPU"; }

// "<lead>: rank A <verb> VA, rank B <verb> VB for tensor 'name'<tail>."
std::string pairError(const std::string& lead, const Request& a, const std::string& va,
                      const Request& b, const std::string& vb, const std::string& verb,
                      const std::string& tail = std::string()) {
  return lead + ": rank " + std::to_string(a.request_rank) + " " + verb + " " + va + ", rank " +
         std::to_string(b.request_rank) + " " + verb + " " + vb + " for tensor '" + a.name +
         "'" + tail + ".";
}

std::string opText(const Request& r) { return opTypeName(r.type); }

std::string checkCommon(const std::vector<Request>& reqs) {
  const Request& a = reqs.front();
  for (const Request& b : reqs) {
    if (b.type != a.type) {
      return pairError("Mismatched collective operations", a, opText(a), b, opText(b),
                       "requested");
    }
    if (b.dtype != a.dtype) {
      return pairError("Mismatched data types", a, common::dataTypeName(a.dtype), b,
                       common::dataTypeName(b.dtype), "had type");
    }
    if ((a.device < 0) != (b.device < 0)) {
      return pairError("Mismatched " + opText(a) + " CPU/GPU device selection", a,
                       deviceText(a.device), b, deviceText(b.device), "specified device");
    }
  }
  return std::string();
}

bool reduces(OpType type) { return type == OpType::kAllreduce || type == OpType::kReducescatter; }

std::string checkParams(const std::vector<Request>& reqs, const std::vector<int>& members) {
  const Request& a = reqs.front();
  for (const Request& b : reqs) {
    if (reduces(a.type) && b.reduce_op != a.reduce_op) {
      return pairError("Mismatched reduce operations", a, common::reduceOpName(a.reduce_op), b,
                       common::reduceOpName(b.reduce_op), "requested");
    }
    if (reduces(a.type) && !(b.prescale == a.prescale)) {
      return pairError("Mismatched prescale factors", a, factorText(a.prescale, b.prescale), b,
                       factorText(b.prescale, a.prescale), "sent factor");
    }
    if (reduces(a.type) && !(b.postscale == a.postscale)) {
      return pairError("Mismatched postscale factors", a, factorText(a.postscale, b.postscale),
                       b, factorText(b.postscale, a.postscale), "sent factor");
    }
    if (a.type == OpType::kBroadcast && b.root_rank != a.root_rank) {
      return pairError("Mismatched BROADCAST root ranks", a, std::to_string(a.root_rank), b,
                       std::to_string(b.root_rank), "specified root rank");
    }
  }
  // Horovod's root_rank is a global rank: it must be one of the set's members.
  if (a.type == OpType::kBroadcast &&
      std::find(members.begin(), members.end(), a.root_rank) == members.end()) {
    return "Invalid BROADCAST root rank " + std::to_string(a.root_rank) + " for tensor '" +
           a.name + "': it is not a member of the process set (" +
           std::to_string(members.size()) + " ranks).";
  }
  if (a.type == OpType::kReducescatter && a.reduce_op != common::ReduceOp::kSum &&
      a.reduce_op != common::ReduceOp::kAverage) {
    return "REDUCESCATTER supports only SUM and AVERAGE: rank " +
           std::to_string(a.request_rank) + " requested " + common::reduceOpName(a.reduce_op) +
           " for tensor '" + a.name + "'.";
  }
  return std::string();
}

// Allgather and alltoall concatenate / split along dim 0, so only the other dims must agree.
bool firstDimMayDiffer(OpType type) {
  return type == OpType::kAllgather || type == OpType::kAlltoall;
}

bool needsDims(OpType type) {
  return firstDimMayDiffer(type) || type == OpType::kReducescatter;
}

std::string checkShapes(const std::vector<Request>& reqs) {
  const Request& a = reqs.front();
  if (a.type == OpType::kBarrier) return std::string();
  for (const Request& b : reqs) {
    if (needsDims(a.type) && b.shape.empty()) {
      return "Rank " + std::to_string(b.request_rank) + " tried to " + opText(a) +
             " a rank-zero (scalar) tensor '" + a.name + "'; it needs at least one dimension.";
    }
    bool same = firstDimMayDiffer(a.type)
                    ? b.shape.size() == a.shape.size() &&
                          std::equal(a.shape.begin() + 1, a.shape.end(), b.shape.begin() + 1)
                    : b.shape == a.shape;
    if (!same) {  // the message is built only here: every response passes through this loop
      const std::string lead = "Mismatched " + opText(a) + " tensor shapes";
      return pairError(lead, a, shapeText(a.shape), b, shapeText(b.shape),
                       "sent a tensor of shape",
                       firstDimMayDiffer(a.type) ? " (only the first dimension may differ)" : "");
    }
  }
  return std::string();
}

std::string splitsError(const Request& r, const std::string& what) {
  return "Invalid ALLTOALL splits for tensor '" + r.name + "' from rank " +
         std::to_string(r.request_rank) + ": " + what + ".";
}

// Fills row r of the splits matrix from rank r's request, or explains why it cannot.
std::string splitsRow(const Request& r, size_t n, std::vector<int64_t>* row) {
  int64_t dim0 = r.shape.front();
  if (r.splits.empty()) {
    if (dim0 % static_cast<int64_t>(n) != 0) {
      return splitsError(r, "no splits given and the first dimension " + std::to_string(dim0) +
                                " does not divide evenly among " + std::to_string(n) + " ranks");
    }
    row->assign(n, dim0 / static_cast<int64_t>(n));
    return std::string();
  }
  if (r.splits.size() != n) {
    return splitsError(r, std::to_string(r.splits.size()) + " splits, expected " +
                              std::to_string(n) + " (one per process set rank)");
  }
  int64_t sum = 0;
  for (int64_t s : r.splits) {
    if (s < 0 || s > dim0 - sum) {
      return splitsError(r, "splits " + shapeText(r.splits) + " do not fit the first dimension " +
                                std::to_string(dim0));
    }
    sum += s;
  }
  *row = r.splits;
  return std::string();
}

std::string checkJoin(const Request& a, const std::vector<int>& absent) {
  if (absent.empty() || a.type == OpType::kAllreduce) return std::string();
  std::string ranks;
  for (size_t i = 0; i < absent.size(); ++i) ranks += (i ? ", " : "") + std::to_string(absent[i]);
  return opText(a) + " is not supported with hvd.join(): rank" + (absent.size() > 1 ? "s " : " ") +
         ranks + (absent.size() > 1 ? " have" : " has") + " joined without submitting tensor '" +
         a.name + "'; only allreduce can run while ranks have joined.";
}

// Per-op fields of a valid response (Response field comments in message.h).
std::string fillFields(const std::vector<Request>& reqs, Response* out) {
  const Request& a = reqs.front();
  if (a.type == OpType::kAllreduce || a.type == OpType::kBroadcast) {
    out->counts = {elementCount(a.shape)};
  }
  if (needsDims(a.type)) out->row_shape.assign(a.shape.begin() + 1, a.shape.end());
  if (a.type == OpType::kAllgather) {
    out->counts = {static_cast<int64_t>(a.shape.size()) - 1};  // row dims (Note [Allgather fusion])
    for (const Request& r : reqs) out->first_dims.push_back(r.shape.front());
  }
  if (a.type == OpType::kReducescatter) out->first_dims.assign(a.shape.begin(), a.shape.end());
  if (a.type == OpType::kAlltoall) {
    for (const Request& r : reqs) {
      std::vector<int64_t> row;
      std::string error = splitsRow(r, reqs.size(), &row);
      if (!error.empty()) return error;
      out->splits_matrix.insert(out->splits_matrix.end(), row.begin(), row.end());
    }
  }
  return std::string();
}

}  // namespace

int64_t elementCount(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) return 0;
    if (n > std::numeric_limits<int64_t>::max() / d) return std::numeric_limits<int64_t>::max();
    n *= d;
  }
  return n;
}

uint64_t requestBytes(const Request& r) {
  return static_cast<uint64_t>(elementCount(r.shape)) * common::dataTypeSize(r.dtype);
}

Response buildResponse(const std::vector<int>& members, const std::vector<Request>& requests,
                       const std::vector<int>& absent) {
  const Request& a = requests.front();
  Response out;
  out.type = a.type;
  out.keys = {a.key};
  out.dtype = a.dtype;
  out.reduce_op = a.reduce_op;
  out.prescale = a.prescale;
  out.postscale = a.postscale;
  out.root_rank = a.root_rank;
  out.process_set = a.process_set;
  out.device = a.device;
  std::string error = checkCommon(requests);
  if (error.empty()) error = checkJoin(a, absent);
  if (error.empty()) error = checkParams(requests, members);
  if (error.empty()) error = checkShapes(requests);
  if (error.empty()) error = fillFields(requests, &out);
  if (!error.empty()) {
    Response failed;
    failed.status = ResponseType::kError;
    failed.type = a.type;
    failed.keys = {a.key};
    failed.dtype = a.dtype;
    failed.error = std::move(error);
    failed.process_set = a.process_set;
    failed.device = a.device;
    return failed;
  }
  return out;
}

}  // namespace hvd::coord
