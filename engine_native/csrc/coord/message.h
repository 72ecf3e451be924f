// Request / Response: the negotiation vocabulary. A framework thread's enqueue becomes a Request
// (sent to rank 0 over the control channel); rank 0 answers with Responses that every member of
// the process set executes in the order received. encode/decode are a compact little-endian
// binary format; decode validates every size and enum and rejects bad input with kInternal.
// Tensors are named by Keys of the holding rank's KeyTable (coord/key_table.h); names travel
// as strings on the wire and are interned again on arrival, so Keys never cross ranks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/small_vector.h"
#include "common/status.h"
#include "coord/key_table.h"

namespace hvd::coord {

enum class OpType : int32_t {
  kAllreduce = 0, kAllgather = 1, kBroadcast = 2, kAlltoall = 3, kReducescatter = 4,
  kBarrier = 5, kJoin = 6,
};
const char* opTypeName(OpType type);  // "ALLREDUCE", ...

// A tensor shape; up to four dimensions without touching the heap.
using Shape = common::SmallVector<int64_t, 4>;

struct Request {
  int32_t request_rank = 0;        // global rank of the sender
  OpType type = OpType::kAllreduce;
  std::string name;
  Key key;                         // name's key on the rank holding this Request
  common::DataType dtype = common::DataType::kFloat32;
  Shape shape;
  common::ReduceOp reduce_op = common::ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root_rank = 0;           // broadcast root, a global rank
  int32_t process_set = 0;
  int32_t group_id = -1;           // grouped ops: same id lands in the same response batch
  int32_t device = -1;             // -1 = CPU
  std::vector<int64_t> splits;     // alltoall: rows sent to each set rank (empty = even)
};

enum class ResponseType : int32_t { kOk = 0, kError = 1 };

// One executable unit: one op over one or more tensors (fused allreduce), or an error for names.
// A one-tensor Response copies without heap allocation (keys and counts are kept inline).
struct Response {
  ResponseType status = ResponseType::kOk;
  OpType type = OpType::kAllreduce;
  common::SmallVector<Key, 1> keys;     // fused tensors, in fusion-buffer order
  std::string error;                    // when status == kError, raised on every rank
  common::DataType dtype = common::DataType::kFloat32;
  common::ReduceOp reduce_op = common::ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root_rank = 0;
  int32_t process_set = 0;
  int32_t device = -1;
  // Per name, its element count (allreduce/broadcast) — lets joined ranks supply zeros.
  // Allgather: per name, the number of its row dims (its dims after the first).
  common::SmallVector<int64_t, 1> counts;
  // Allgather: first-dim size per set rank, tensor-major for a fused one (name i, set rank k
  // at i * set_size + k). Reducescatter: the input shape.
  std::vector<int64_t> first_dims;
  // Shape without dim 0 (allgather/alltoall/reducescatter); a fused allgather's row shapes,
  // one after another (counts[i] dims each).
  std::vector<int64_t> row_shape;
  // Alltoall: splits matrix, set_size x set_size rows, row r = rows rank r sends to each rank.
  std::vector<int64_t> splits_matrix;
  int32_t last_joined_rank = -1;        // join: global rank of the last rank to join
};

// Control message types on the wire (transport::ControlMessage::type).
enum class MessageType : uint32_t {
  kRequests = 1,      // worker -> rank 0: RequestList
  kResponses = 2,     // rank 0 -> worker: ResponseList
  kShutdown = 3,      // worker -> rank 0: this rank shuts down; rank 0 -> all: everyone agreed
  kAbort = 4,         // either way: payload = text; rank 0 relays to every worker
};

// Tuned parameters (autotune) rank 0 attaches to a ResponseList. Rule relied on: every rank
// applies them before it executes the list's first response (at once when its share of the
// list is empty), so all ranks switch between the same two responses, never mid-batch.
struct ParamsUpdate {
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0.0;
  bool cache_enabled = true;
  bool hierarchical_allreduce = false;
  int32_t phase = 0;       // autotune::AutotunePhase as int (warmup, bayes, categorical, done)
  int32_t trial = 0;       // "trial k of n" of that phase, for reporting on every rank
  int32_t trials = 0;
};

struct RequestList {
  std::vector<Request> requests;
};
struct ResponseList {
  std::vector<Response> responses;
  std::optional<ParamsUpdate> params;  // encoded only when present (older lists stay valid)
};

// Responses name tensors by the sender's keys (encode) and the receiver's (decode: each name is
// interned in `keys`, so a name this rank never submitted — a joined rank's — still gets one).
std::string encode(const RequestList& list);
std::string encode(const ResponseList& list, const KeyTable& keys);
std::string encode(const Response* const* responses, size_t count,
                   const std::optional<ParamsUpdate>& params, const KeyTable& keys);
common::Status decode(const std::string& bytes, RequestList* out);
common::Status decode(const std::string& bytes, KeyTable& keys, ResponseList* out);

}  // namespace hvd::coord
