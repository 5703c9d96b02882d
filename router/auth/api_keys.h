#pragma once
// API keys for the client APIs (HTTP bearer tokens, gRPC "authorization: Bearer" metadata): stored
// as SHA-256 hashes in router.api_keys_file, one key a line, reloaded when the file changes (a
// Kubernetes Secret mounted as a file updates in place), with per-key limits:
//   <name> sha256:<64 hex> [rate=<requests a second>] [burst=<requests>] [streams=<at once>]
// `printf %s "$KEY" | sha256sum` makes the hash. Blank lines and # comments are ignored. A key
// past its rate or its concurrent streams is refused with RESOURCE_EXHAUSTED and a retry-after
// hint (HTTP 429 with Retry-After); a missing or unknown key with UNAUTHENTICATED (401).
// Thread-safe: admissions come from the HTTP and gRPC threads.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/clock.h"

namespace tailserve {

class ApiKeys {
 public:
  struct Limits {
    double rate = 0;   // requests a second (0: unlimited)
    double burst = 0;  // bucket size (0: max(1, rate))
    int streams = 0;   // requests at once (0: unlimited)
  };
  // Holds one of the key's concurrent streams until destroyed.
  class Lease {
   public:
    Lease(std::shared_ptr<ApiKeys*> owner, std::string hash, std::string name)
        : owner_(std::move(owner)), hash_(std::move(hash)), name_(std::move(name)) {}
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    const std::string& name() const { return name_; }

   private:
    std::shared_ptr<ApiKeys*> owner_;
    std::string hash_, name_;
  };

  explicit ApiKeys(const Clock& clock = SystemClock::Get());
  ~ApiKeys();

  // Parses a keys file's text; INVALID_ARGUMENT naming the line on an error (nothing replaced).
  absl::Status Load(std::string_view text);
  // Reads `path` and loads it if its content changed since the last call.
  absl::Status ReloadIfChanged(const std::string& path);
  size_t size() const;

  // The bearer token of a request ("Bearer <key>" or the key alone). *name: the key's name when
  // it is known (for the per-key metrics), else empty.
  absl::StatusOr<std::unique_ptr<Lease>> Admit(std::string_view authorization, std::string* name = nullptr);

  static std::string Sha256Hex(std::string_view data);

 private:
  struct Entry {
    std::string name;
    Limits limits;
    double tokens = 0;
    SteadyTime refilled{};
    int active = 0;
  };
  void Release(const std::string& hash);

  const Clock& clock_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> by_hash_;  // sha256 hex -> key
  std::string loaded_text_;
  std::shared_ptr<ApiKeys*> self_;  // leases outliving this object release nothing
};

}  // namespace tailserve
