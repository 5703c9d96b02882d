#pragma once
// TLS for the gRPC servers and channels from certificate files, re-read while serving so a
// rotated certificate or key takes effect without a restart (gRPC's file-watcher provider).
// Empty files: plaintext. Mutual TLS: a server given a CA requires and verifies client
// certificates chaining to it; a channel given a certificate presents it.
#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"

namespace tailserve {

struct TlsFiles {
  std::string cert_file, key_file;  // this side's certificate chain and private key (PEM)
  // Server: the CA client certificates must chain to (set: mutual TLS, required); channel: the CA
  // the server's certificate must chain to (required for TLS).
  std::string ca_file;
  bool enabled() const { return !cert_file.empty() || !ca_file.empty(); }
};

// How often the files are re-read.
inline constexpr unsigned kTlsReloadSeconds = 5;

// Checks the files at start (readable PEM, the key matches the certificate), so a mistake stops
// the process naming the config key (`prefix` + "cert_file", ...), not every handshake later.
absl::Status ValidateTlsFiles(const TlsFiles& files, const std::string& prefix);

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(const TlsFiles& files,
                                                                               const std::string& prefix);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> GrpcChannelCredentials(const TlsFiles& files,
                                                                                 const std::string& prefix);

}  // namespace tailserve
