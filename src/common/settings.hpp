// SPDX-License-Identifier: Apache-2.0
// The one table of DYAD's settings: every DYAD_* variable, its type, default,
// meaning and the components that read it. This is the only code that reads
// the environment (DYAD_* variables, and other libraries' own through
// foreign()); everything else asks it for typed values, checked here with
// one rule: a value that does not parse is an error naming the variable and
// where the value came from (booleans excepted: set means on, as in DYAD,
// with a warning). Components get their values when they are made (the
// client's Config, the transports' dtl/options.hpp, dyadd's options).
//
// Where a value comes from, in increasing precedence:
//   default  the table's default
//   file     a line NAME=VALUE of the file named by DYAD_CONFIG_FILE
//   env      the process environment
//   option   a command-line option of the program (dyadd --memory ...)
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "status.hpp"

namespace dyad::settings {

enum class Type { text, flag, count, seconds, size, level, transport };
enum class Source { none, defaults, file, env, option };

struct Setting {
    const char* name;
    Type type;
    const char* def;      // as text; nullptr: unset by default
    const char* readers;  // which components read it
    const char* meaning;
};

// Every setting, in the order the user guide lists them.
const std::vector<Setting>& table();
const Setting* find(std::string_view name);
const char* type_name(Type t);
const char* source_name(Source s);

struct Value {
    std::string text;
    Source source = Source::none;
    bool set() const { return source != Source::none; }
};

// The raw text of a setting and where it came from. An empty environment
// value counts as set for flags (DYAD's set-but-empty means on) and as unset
// for every other type.
Value lookup(std::string_view name);

// Typed values: the default when unset; a value that does not parse is an
// error naming the setting and where the value came from.
[[nodiscard]] Result<bool> flag(std::string_view name);
[[nodiscard]] Result<uint64_t> size(std::string_view name);
[[nodiscard]] Result<unsigned> count(std::string_view name, unsigned min, unsigned max);
// Seconds; nullopt when unset and the table has no default (e.g. "forever").
[[nodiscard]] Result<std::optional<double>> seconds(std::string_view name);
std::string text(std::string_view name);
// A byte count within [min, max]; out of it, an error naming the setting
// and `range` (how the limits read to a user, e.g. "[4M, 2G]").
[[nodiscard]] Result<uint64_t> size(std::string_view name, uint64_t min, uint64_t max,
                                    const char* range);
// A word among `words` (or a synonym among `synonyms`), as set; anything
// else is an error naming the setting and listing `words`. Unset: the
// table's default.
[[nodiscard]] Result<std::string> choice(std::string_view name,
                                         std::initializer_list<std::string_view> words,
                                         std::initializer_list<std::string_view> synonyms = {},
                                         dyad_rc_t rc = DYAD_RC_NOCTX);
// A variable of another library (UCX_TLS, FI_*): its value, or nullopt when
// unset. Not a DYAD setting: no file, no default.
std::optional<std::string> foreign(const char* name);

// Records a program option (highest precedence) for this process.
void set_option(std::string_view name, std::string value);

// Checks the configuration file (readable, known names, well-formed lines)
// and that every value of the settings `reader` reads ("client", "dyadd";
// empty: all) parses as its type.
[[nodiscard]] Status check(std::string_view reader = "");

// Every setting with its effective value and source (`dyad config`).
nlohmann::json describe();
// The user guide's table, generated from this one.
std::string markdown();

}  // namespace dyad::settings
