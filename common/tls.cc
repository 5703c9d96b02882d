#include "common/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/str_cat.h"

namespace tailserve {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& key) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(key, ": cannot read ", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return e ? buf : "no PEM data";
}

}  // namespace

absl::Status ValidateTlsFiles(const TlsFiles& f, const std::string& prefix) {
  if (f.cert_file.empty() != f.key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "cert_file and ", prefix, "key_file: set both or neither"));
  }
  X509* cert = nullptr;
  if (!f.cert_file.empty()) {
    absl::StatusOr<std::string> pem = ReadPem(f.cert_file, prefix + "cert_file");
    if (!pem.ok()) return pem.status();
    BIO* bio = BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size()));
    cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
    if (!cert) return absl::InvalidArgumentError(absl::StrCat(prefix, "cert_file: ", f.cert_file, ": not a PEM certificate (", OpenSslError(), ")"));
    absl::StatusOr<std::string> key_pem = ReadPem(f.key_file, prefix + "key_file");
    if (!key_pem.ok()) {
      X509_free(cert);
      return key_pem.status();
    }
    bio = BIO_new_mem_buf(key_pem->data(), static_cast<int>(key_pem->size()));
    EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
    const bool matches = key && X509_check_private_key(cert, key) == 1;
    EVP_PKEY_free(key);
    X509_free(cert);
    if (!matches) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "key_file: ", f.key_file, " is not the private key of ",
                                                     prefix, "cert_file"));
    }
  }
  if (!f.ca_file.empty()) {
    absl::StatusOr<std::string> pem = ReadPem(f.ca_file, prefix + "ca_file");
    if (!pem.ok()) return pem.status();
    BIO* bio = BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size()));
    X509* ca = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
    if (!ca) return absl::InvalidArgumentError(absl::StrCat(prefix, "ca_file: ", f.ca_file, ": not a PEM certificate"));
    X509_free(ca);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(const TlsFiles& f,
                                                                               const std::string& prefix) {
  if (!f.enabled()) return grpc::InsecureServerCredentials();
  if (f.cert_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "cert_file: a server needs its certificate for TLS"));
  }
  if (absl::Status s = ValidateTlsFiles(f, prefix); !s.ok()) return s;
  auto provider = f.ca_file.empty()
                      ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(f.key_file, f.cert_file,
                                                                                             kTlsReloadSeconds)
                      : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                            f.key_file, f.cert_file, f.ca_file, kTlsReloadSeconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!f.ca_file.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> GrpcChannelCredentials(const TlsFiles& f,
                                                                                 const std::string& prefix) {
  if (!f.enabled()) return grpc::InsecureChannelCredentials();
  if (f.ca_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "ca_file: TLS to a server needs the CA its certificate chains to"));
  }
  if (absl::Status s = ValidateTlsFiles(f, prefix); !s.ok()) return s;
  auto provider = f.cert_file.empty()
                      ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(f.ca_file, kTlsReloadSeconds)
                      : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                            f.key_file, f.cert_file, f.ca_file, kTlsReloadSeconds);
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!f.cert_file.empty()) options.watch_identity_key_cert_pairs();
  return grpc::experimental::TlsCredentials(options);
}

}  // namespace tailserve
