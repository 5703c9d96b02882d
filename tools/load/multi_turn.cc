#include "tools/load/multi_turn.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <queue>
#include <random>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/block_hash.h"
#include "tailserve/v1/generation.grpc.pb.h"
#include "tools/load/stream_call.h"

namespace tailserve {
namespace {

constexpr size_t kOracleBlockTokens = 16;  // the workers' KV block

// One unbounded cache of chained block hashes: what a prompt would find cached, then what it and
// its answer leave behind.
class OracleCache {
 public:
  // `hashes`: the prompt's full blocks (ChainBlockHashes); whole blocks count, leaving the last
  // token, which is always computed (as the workers do).
  int64_t CachedPrefix(const std::vector<uint64_t>& hashes, size_t prompt_tokens) const {
    const size_t usable = prompt_tokens == 0 ? 0 : (prompt_tokens - 1) / kOracleBlockTokens;
    size_t b = 0;
    while (b < std::min(usable, hashes.size()) && blocks_.contains(hashes[b])) ++b;
    return static_cast<int64_t>(b * kOracleBlockTokens);
  }
  void Insert(const std::vector<uint64_t>& hashes) { blocks_.insert(hashes.begin(), hashes.end()); }

 private:
  std::unordered_set<uint64_t> blocks_;
};

struct Conversation {
  std::vector<int32_t> tokens;  // everything so far: system prompt, messages, answers
  std::vector<int32_t> answer;  // the turn in flight's streamed tokens
  int turn = 0;
};

}  // namespace

LoadReport RunMultiTurn(const LoadOptions& o, const MultiTurnSpec& spec) {
  auto stub = LoadStub(o.target);
  LoadReport report;
  report.ttft_slo_s = o.ttft_slo_s, report.tpot_slo_s = o.tpot_slo_s;
  const int users = std::max(1, spec.users), turns = std::max(1, spec.turns);
  report.results.resize(static_cast<size_t>(users) * turns);
  std::mt19937_64 rng(o.seed);
  auto token = [&] { return static_cast<int32_t>(rng() % static_cast<uint64_t>(o.vocab)); };
  auto around = [&](int mean) {  // uniform in [0.5, 1.5] x mean, at least 1
    return std::max(1, static_cast<int>(std::uniform_real_distribution<double>(0.5, 1.5)(rng) * mean));
  };
  std::vector<int32_t> system(static_cast<size_t>(std::max(0, spec.system_tokens)));
  for (int32_t& t : system) t = token();
  std::vector<Conversation> convs(static_cast<size_t>(users));
  for (Conversation& c : convs) c.tokens = system;
  OracleCache oracle;
  report.oracle_cached_tokens = 0;

  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  std::mutex mu;
  std::condition_variable cv;
  // (due time, conversation); the earliest first.
  using Due = std::pair<Clock::time_point, int>;
  std::priority_queue<Due, std::vector<Due>, std::greater<>> due;
  for (int u = 0; u < users; ++u) {
    const double at = spec.user_rate > 0 ? u / spec.user_rate : 0.0;
    due.push({start + std::chrono::microseconds(static_cast<int64_t>(at * 1e6)), u});
  }
  int finished = 0;  // conversations whose last turn ended (or that failed)
  std::unique_lock lock(mu);
  while (finished < users) {
    if (due.empty() || Clock::now() < due.top().first) {
      if (due.empty()) cv.wait(lock);
      else cv.wait_until(lock, due.top().first);
      continue;
    }
    const int u = due.top().second;
    due.pop();
    Conversation& c = convs[static_cast<size_t>(u)];
    // This turn's new user message joins the conversation.
    const int message = around(spec.user_tokens);
    for (int k = 0; k < message; ++k) c.tokens.push_back(token());
    const std::vector<uint64_t> blocks = ChainBlockHashes(0, c.tokens, kOracleBlockTokens);
    report.oracle_cached_tokens += oracle.CachedPrefix(blocks, c.tokens.size());
    report.oracle_prompt_tokens += static_cast<int64_t>(c.tokens.size());
    oracle.Insert(blocks);
    const int32_t length = around(spec.answer_tokens);
    v1::GenerateRequest req;
    req.set_request_id(absl::StrCat("chat-", u, "-", c.turn));
    req.set_session_id(absl::StrCat("chat-", u));
    for (int32_t t : c.tokens) req.add_prompt_token_ids(t);
    SetPlannedLength(o, length, rng, &req);
    req.set_priority(static_cast<v1::Priority>(o.priority));
    RequestResult* result = &report.results[static_cast<size_t>(u) * turns + c.turn];
    result->expected_tokens = length;
    c.answer.clear();
    lock.unlock();
    StartStreamingCall(stub.get(), std::move(req), o.timeout_s, o.client_stop ? length : 0, result, &c.answer,
                       [&, u, result] {
                         std::lock_guard done_lock(mu);
                         Conversation& conv = convs[static_cast<size_t>(u)];
                         conv.tokens.insert(conv.tokens.end(), conv.answer.begin(), conv.answer.end());
                         oracle.Insert(ChainBlockHashes(0, conv.tokens, kOracleBlockTokens));
                         if (result->code != 0 || ++conv.turn >= turns) {
                           ++finished;  // a failed turn ends its conversation: the user gives up
                         } else {
                           due.push({Clock::now() + std::chrono::microseconds(static_cast<int64_t>(spec.think_s * 1e6)), u});
                         }
                         cv.notify_all();
                       });
    lock.lock();
  }
  lock.unlock();
  report.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  // A conversation that gave up left its later turns unsent: they are not results.
  std::erase_if(report.results, [](const RequestResult& r) { return r.expected_tokens == 0; });
  return report;
}

}  // namespace tailserve
