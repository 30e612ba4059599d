// A throw-away PKI for tests, made with the openssl CLI in a fresh temporary directory: a CA, a
// node certificate for 127.0.0.1/localhost signed by it, and a "rogue" certificate of another CA.
#pragma once

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "config/config.h"

namespace fluxon::testing {

class TestPki {
 public:
  TestPki() {
    char tmpl[] = "/tmp/fluxon-pki-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return;
    dir_ = tmpl;
    std::ofstream(dir_ + "/ext") << "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                    "extendedKeyUsage=serverAuth,clientAuth\n"
                                    "basicConstraints=CA:FALSE\n";
    ok_ = Ca("ca") && Ca("rogue-ca") && Leaf("node", "ca") && Leaf("rogue", "rogue-ca");
  }
  ~TestPki() {
    if (!dir_.empty()) (void)std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
  }
  bool ok() const { return ok_; }
  // `leaf` is "node" (the cluster's) or "rogue"; the CA is always the cluster's.
  TlsConfig Config(const std::string& leaf = "node") const {
    return TlsConfig{dir_ + "/" + leaf + ".pem", dir_ + "/" + leaf + ".key", dir_ + "/ca.pem"};
  }

 private:
  bool Run(const std::string& args) const {
    return std::system(
               absl::StrCat("cd '", dir_, "' && openssl ", args, " >/dev/null 2>&1").c_str()) == 0;
  }
  bool Ca(const std::string& n) const {
    return Run(absl::StrCat(
        "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-days 2 -keyout ",
        n, ".key -out ", n, ".pem -subj /CN=", n, " -addext basicConstraints=critical,CA:TRUE"));
  }
  bool Leaf(const std::string& n, const std::string& ca) const {
    return Run(absl::StrCat("req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ",
                            n, ".key -out ", n, ".csr -subj /CN=", n)) &&
           Run(absl::StrCat("x509 -req -in ", n, ".csr -CA ", ca, ".pem -CAkey ", ca,
                            ".key -CAcreateserial -days 2 -extfile ext -out ", n, ".pem"));
  }
  std::string dir_;
  bool ok_ = false;
};

}  // namespace fluxon::testing
