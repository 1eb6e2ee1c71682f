#pragma once
// Addresses and secrets of the control plane, shared by the controller and
// its clients (the lean `troupe` binary links this without the server).

#include "runtime/error.hpp"

#include <string>
#include <string_view>
#include <utility>

namespace troupe::cluster {

/// "host:port" split; errors say what is wrong with the address.
expected<std::pair<std::string, int>> parse_listen_address(const std::string& address);
/// 127.0.0.0/8, ::1 and localhost.
bool is_loopback_host(const std::string& host);

/// A random token (32 bytes from the kernel, hex).
expected<std::string> make_token();
/// Whether `given` is the `secret`, in time independent of where they
/// differ (false for an empty secret).
bool same_secret(std::string_view given, std::string_view secret);
/// A token file's text without its line end.
expected<std::string> read_token_file(const std::string& path);
/// A secret's file (token, cluster secret) without its line end; refused
/// when others can read it.
expected<std::string> read_secret_file(const std::string& path);
/// Reads the token from `path`, or creates it there (mode 0600) when absent;
/// refuses a token file that others can read.
expected<std::string> load_or_create_token(const std::string& path);

} // namespace troupe::cluster
