// SPDX-License-Identifier: Apache-2.0
// Environment variables set by a test and unset when it ends.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

struct EnvGuard {
    std::vector<std::string> names;
    void set(const char* n, const char* v) {
        setenv(n, v, 1);
        names.push_back(n);
    }
    ~EnvGuard() {
        for (auto& n : names) unsetenv(n.c_str());
    }
};
