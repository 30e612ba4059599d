#include "security/security_files.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fstream>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "common/private_files.h"
#include "spdlog/spdlog.h"

namespace fluxon::security {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// Certificates, keys and secrets are small; a path naming something else (a device, a log) is
// refused instead of read without end.
constexpr size_t kMaxSecurityFileBytes = 1 << 20;

absl::StatusOr<std::string> ReadFile(const std::string& key, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrFormat("%s: cannot read %s", key, path));
  }
  std::string text(kMaxSecurityFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return absl::NotFoundError(absl::StrFormat("%s: cannot read %s", key, path));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxSecurityFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s is over %d bytes: not a certificate, key or secret file", key, path,
                        kMaxSecurityFileBytes));
  }
  return text;
}

BioPtr MemBio(const std::string& text) {
  return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// The first certificate of a PEM text, or null.
X509Ptr FirstCertificate(const std::string& pem) {
  BioPtr bio = MemBio(pem);
  return X509Ptr(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

std::vector<std::string> CertificateNames(X509* cert) {
  std::vector<std::string> names;
  auto* sans =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (sans != nullptr) {
    for (int i = 0; i < sk_GENERAL_NAME_num(sans); ++i) {
      const GENERAL_NAME* n = sk_GENERAL_NAME_value(sans, i);
      if (n->type == GEN_DNS) {
        const ASN1_STRING* s = n->d.dNSName;
        names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                           ASN1_STRING_length(s));
      } else if (n->type == GEN_IPADD) {
        const ASN1_OCTET_STRING* ip = n->d.iPAddress;
        char buf[64] = {};
        const unsigned char* b = ASN1_STRING_get0_data(ip);
        if (ASN1_STRING_length(ip) == 4) {
          absl::SNPrintF(buf, sizeof(buf), "%d.%d.%d.%d", b[0], b[1], b[2], b[3]);
          names.emplace_back(buf);
        }
      }
    }
    GENERAL_NAMES_free(sans);
  }
  if (names.empty()) {
    char cn[256] = {};
    if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn)) >
        0) {
      names.emplace_back(cn);
    }
  }
  return names;
}

}  // namespace

absl::StatusOr<TlsMaterial> LoadTlsMaterial(const TlsConfig& tls) {
  TlsMaterial m;
  absl::StatusOr<std::string> cert = ReadFile("security.tls.cert_file", tls.cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile("security.tls.key_file", tls.key_file);
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> ca = ReadFile("security.tls.ca_file", tls.ca_file);
  if (!ca.ok()) return ca.status();
  X509Ptr leaf = FirstCertificate(*cert);
  if (!leaf) {
    return absl::InvalidArgumentError(
        absl::StrFormat("security.tls.cert_file: %s holds no PEM certificate", tls.cert_file));
  }
  if (!FirstCertificate(*ca)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("security.tls.ca_file: %s holds no PEM certificate", tls.ca_file));
  }
  BioPtr kbio = MemBio(*key);
  PkeyPtr pkey(PEM_read_bio_PrivateKey(kbio.get(), nullptr, nullptr, nullptr));
  if (!pkey) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrFormat(
        "security.tls.key_file: %s holds no (unencrypted) PEM private key", tls.key_file));
  }
  if (X509_check_private_key(leaf.get(), pkey.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrFormat("security.tls.key_file: %s is not the key of the certificate in %s",
                        tls.key_file, tls.cert_file));
  }
  m.names = CertificateNames(leaf.get());
  m.cert_chain = std::move(*cert);
  m.private_key = std::move(*key);
  m.ca_certs = std::move(*ca);
  return m;
}

absl::StatusOr<std::string> LoadClusterSecret(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile("security.cluster_secret_file", path);
  if (!text.ok()) return text.status();
  std::string secret(absl::StripAsciiWhitespace(*text));
  if (secret.size() < kMinClusterSecretBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "security.cluster_secret_file: %s holds %d bytes; a cluster secret needs at least %d "
        "(e.g. `openssl rand -hex 32 > %s`)",
        path, secret.size(), kMinClusterSecretBytes, path));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 0077) != 0) {
    spdlog::warn(
        "security.cluster_secret_file {} may be read by other users (mode {:o}); "
        "chmod 600 it",
        path, st.st_mode & 0777);
  }
  return secret;
}

std::string MachineSecretPath() {
  return absl::StrFormat("/dev/shm/fluxon-cluster-secret-%d", ::geteuid());
}

absl::StatusOr<std::string> LoadOrCreateMachineSecret(const std::string& path) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
      if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 0077) != 0) {
        return absl::PermissionDeniedError(absl::StrFormat(
            "the machine cluster secret %s is not a regular file owned by uid %d with mode 0600 "
            "(uid %d, mode %o); remove it, or set security.cluster_secret_file",
            path, ::geteuid(), st.st_uid, st.st_mode & 07777));
      }
      return LoadClusterSecret(path);
    }
    if (errno != ENOENT) {
      return absl::UnavailableError(
          absl::StrFormat("machine cluster secret %s: %s", path, std::strerror(errno)));
    }
    unsigned char raw[32];
    if (RAND_bytes(raw, sizeof(raw)) != 1) {
      return absl::InternalError("OpenSSL could not generate a cluster secret");
    }
    std::string hex;
    for (unsigned char b : raw) hex += absl::StrFormat("%02x", b);
    hex += "\n";
    // An unguessable temporary name: a name another local user can predict could be planted
    // ahead of us and stop every start.
    auto nonce = RandomHex(16);
    if (!nonce.ok()) return nonce.status();
    const std::string tmp = absl::StrFormat("%s.%s.tmp", path, *nonce);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      return absl::UnavailableError(
          absl::StrFormat("creating the machine cluster secret %s: %s", tmp, std::strerror(errno)));
    }
    const bool written =
        ::write(fd, hex.data(), hex.size()) == static_cast<ssize_t>(hex.size()) && ::fsync(fd) == 0;
    ::close(fd);
    // link() publishes the complete file under its name, or fails when another process won.
    const bool linked = written && ::link(tmp.c_str(), path.c_str()) == 0;
    const int link_errno = errno;
    ::unlink(tmp.c_str());
    if (linked) {
      spdlog::info("created the machine cluster secret {} (mode 0600)", path);
      return std::string(absl::StripAsciiWhitespace(hex));
    }
    if (!written || link_errno != EEXIST) {
      return absl::UnavailableError(absl::StrFormat("creating the machine cluster secret %s: %s",
                                                    path, std::strerror(link_errno)));
    }
  }
  return absl::UnavailableError(
      absl::StrFormat("the machine cluster secret %s kept changing under us", path));
}

}  // namespace fluxon::security
