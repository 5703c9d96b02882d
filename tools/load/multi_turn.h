#pragma once
// A synthetic multi-turn chat workload: conversations start at a rate; each turn sends the whole
// conversation so far (a system prompt every conversation shares, then each earlier user message
// and answer as they really were streamed back) plus a new user message, and the next turn follows
// the answer after a think time. The prefix structure is real, so it exercises prefix caching and
// cache-aware placement the way chat traffic does. Each request carries its conversation as
// session_id.
#include <cstdint>

#include "tools/load/load_generator.h"

namespace tailserve {

struct MultiTurnSpec {
  int users = 32;             // conversations
  int turns = 4;              // requests per conversation
  double user_rate = 2.0;     // conversations started per second
  int system_tokens = 1024;   // the shared system prompt
  int user_tokens = 128;      // mean new user message; each is uniform in [0.5, 1.5] x this
  int answer_tokens = 128;    // mean answer length, the same spread
  double think_s = 2.0;       // from an answer to the next turn
};

// Runs the workload to its end. report.results holds users x turns results, conversation-major;
// report.oracle_cached_tokens is what one unbounded prefix cache seeing every prompt and answer in
// order would have held (16-token blocks). With options.sim_eos or client_stop each answer ends at
// its planned length; otherwise the planned length is max_tokens.
LoadReport RunMultiTurn(const LoadOptions& options, const MultiTurnSpec& spec);

}  // namespace tailserve
