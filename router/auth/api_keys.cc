#include "router/auth/api_keys.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace tailserve {

ApiKeys::Lease::~Lease() {
  if (ApiKeys* keys = *owner_) keys->Release(hash_);
}

ApiKeys::ApiKeys(const Clock& clock) : clock_(clock), self_(std::make_shared<ApiKeys*>(this)) {}

ApiKeys::~ApiKeys() { *self_ = nullptr; }

std::string ApiKeys::Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), digest, &n, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) absl::StrAppendFormat(&hex, "%02x", digest[i]);
  return hex;
}

absl::Status ApiKeys::Load(std::string_view text_in) {
  const absl::string_view text(text_in.data(), text_in.size());
  std::map<std::string, Entry> next;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("router.api_keys_file line ", line_no, ": ", why));
    };
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 2 || f[1].rfind("sha256:", 0) != 0) return bad("expected <name> sha256:<hex> [rate=N] [burst=N] [streams=N]");
    Entry e;
    e.name = f[0];
    std::string hash = absl::AsciiStrToLower(f[1].substr(7));
    if (hash.size() != 64 || !std::all_of(hash.begin(), hash.end(), [](char c) { return absl::ascii_isxdigit(c); })) {
      return bad("the hash must be 64 hex digits (printf %s \"$KEY\" | sha256sum)");
    }
    for (size_t i = 2; i < f.size(); ++i) {
      const size_t eq = f[i].find('=');
      double v = 0;
      if (eq == std::string::npos || !absl::SimpleAtod(f[i].substr(eq + 1), &v) || v < 0 || !std::isfinite(v)) {
        return bad(absl::StrCat("'", f[i], "': expected rate=, burst= or streams= with a number >= 0"));
      }
      const std::string key = f[i].substr(0, eq);
      if (key == "rate") e.limits.rate = v;
      else if (key == "burst") e.limits.burst = v;
      else if (key == "streams") e.limits.streams = static_cast<int>(v);
      else return bad(absl::StrCat("unknown limit '", key, "'"));
    }
    if (e.limits.burst == 0) e.limits.burst = std::max(1.0, e.limits.rate);
    if (next.count(hash)) return bad("the same key twice");
    next.emplace(std::move(hash), std::move(e));
  }
  std::lock_guard lock(mu_);
  const SteadyTime now = clock_.Now();
  for (auto& [hash, e] : next) {
    // A key kept across a reload keeps its bucket and its streams.
    if (auto old = by_hash_.find(hash); old != by_hash_.end()) {
      e.tokens = std::min(old->second.tokens, e.limits.burst);
      e.refilled = old->second.refilled;
      e.active = old->second.active;
    } else {
      e.tokens = e.limits.burst;
      e.refilled = now;
    }
  }
  by_hash_ = std::move(next);
  return absl::OkStatus();
}

absl::Status ApiKeys::ReloadIfChanged(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("router.api_keys_file: cannot read ", path));
  std::stringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  {
    std::lock_guard lock(mu_);
    if (text == loaded_text_) return absl::OkStatus();
  }
  if (absl::Status st = Load(text); !st.ok()) return st;
  std::lock_guard lock(mu_);
  loaded_text_ = text;
  return absl::OkStatus();
}

size_t ApiKeys::size() const {
  std::lock_guard lock(mu_);
  return by_hash_.size();
}

absl::StatusOr<std::unique_ptr<ApiKeys::Lease>> ApiKeys::Admit(std::string_view authorization, std::string* name) {
  absl::string_view token = absl::StripAsciiWhitespace(absl::string_view(authorization.data(), authorization.size()));
  if (token.size() > 7 && absl::EqualsIgnoreCase(token.substr(0, 7), "bearer ")) {
    token = absl::StripAsciiWhitespace(token.substr(7));
  }
  if (token.empty()) return absl::UnauthenticatedError("an API key is required (Authorization: Bearer <key>)");
  const std::string hash = Sha256Hex(std::string_view(token.data(), token.size()));
  std::lock_guard lock(mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return absl::UnauthenticatedError("invalid API key");
  Entry& e = it->second;
  if (name) *name = e.name;
  if (e.limits.streams > 0 && e.active >= e.limits.streams) {
    return absl::ResourceExhaustedError(absl::StrCat("API key '", e.name, "': ", e.active,
                                                     " requests running, its limit; retry after 1 s"));
  }
  if (e.limits.rate > 0) {
    const SteadyTime now = clock_.Now();
    e.tokens = std::min(e.limits.burst, e.tokens + e.limits.rate * std::chrono::duration<double>(now - e.refilled).count());
    e.refilled = now;
    if (e.tokens < 1) {
      return absl::ResourceExhaustedError(absl::StrCat("API key '", e.name, "': over its rate of ", e.limits.rate,
                                                       " requests a second; retry after ",
                                                       absl::StrFormat("%.3f", (1 - e.tokens) / e.limits.rate), " s"));
    }
    e.tokens -= 1;
  }
  ++e.active;
  return std::make_unique<Lease>(self_, hash, e.name);
}

void ApiKeys::Release(const std::string& hash) {
  std::lock_guard lock(mu_);
  if (auto it = by_hash_.find(hash); it != by_hash_.end() && it->second.active > 0) --it->second.active;
}

}  // namespace tailserve
