#pragma once

// Status propagation. Abseil has no public RETURN_IF_ERROR / ASSIGN_OR_RETURN (Google's own are
// internal), so without these every call site spells out `if (!x.ok()) return x.status();`.
// Both work in functions returning absl::Status or absl::StatusOr<T> (an error converts to either).
//
//   TAILSERVE_RETURN_IF_ERROR(WriteFile(path, text));
//   TAILSERVE_ASSIGN_OR_RETURN(auto config, LoadModelConfig(dir));
//   TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, CpuEngine::Load(dir, options));
//   TAILSERVE_ASSIGN_OR_RETURN(existing, Parse(text));
//
// TAILSERVE_ASSIGN_OR_RETURN expands to several statements in the enclosing scope (so that `lhs`
// may declare a variable there): it cannot be the unbraced body of an `if` or a loop, and a `lhs`
// whose type has a top-level comma must be given a type alias first.

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TAILSERVE_STATUS_MACROS_CONCAT_INNER_(a, b) a##b
#define TAILSERVE_STATUS_MACROS_CONCAT_(a, b) TAILSERVE_STATUS_MACROS_CONCAT_INNER_(a, b)
// A name unique within the translation unit: prefix, line, counter (the line keeps names readable
// in compiler messages, the counter makes two uses on one line distinct).
#define TAILSERVE_STATUS_MACROS_UNIQUE_(prefix)                                    \
  TAILSERVE_STATUS_MACROS_CONCAT_(TAILSERVE_STATUS_MACROS_CONCAT_(prefix, __LINE__), \
                                  TAILSERVE_STATUS_MACROS_CONCAT_(_, __COUNTER__))

// Evaluates `expr` (an absl::Status) once; returns it from the enclosing function if not ok.
#define TAILSERVE_RETURN_IF_ERROR(...) \
  TAILSERVE_RETURN_IF_ERROR_IMPL_(TAILSERVE_STATUS_MACROS_UNIQUE_(tailserve_status_), __VA_ARGS__)
#define TAILSERVE_RETURN_IF_ERROR_IMPL_(status, ...)           \
  do {                                                         \
    if (::absl::Status status = (__VA_ARGS__); !status.ok()) { \
      return status;                                           \
    }                                                          \
  } while (false)

// Evaluates `expr` (an absl::StatusOr<T>) once into a uniquely named temporary; returns its status
// from the enclosing function if not ok, else moves the value into `lhs` (a declaration such as
// `auto x` or `std::unique_ptr<Foo> p`, or an existing variable).
#define TAILSERVE_ASSIGN_OR_RETURN(lhs, ...) \
  TAILSERVE_ASSIGN_OR_RETURN_IMPL_(TAILSERVE_STATUS_MACROS_UNIQUE_(tailserve_statusor_), lhs, __VA_ARGS__)
#define TAILSERVE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, ...) \
  auto statusor = (__VA_ARGS__);                             \
  if (!statusor.ok()) {                                      \
    return std::move(statusor).status();                     \
  }                                                          \
  lhs = *std::move(statusor)
