#pragma once
// GPT-2's byte-level alphabet (bytes_to_unicode), in which byte-level BPE vocab strings are
// spelled: every byte has a printable character, so "Ġthe" stands for the bytes " the".
#include <string>
#include <string_view>

namespace tailserve::bpe_internal {

// Decodes a vocab string ("Ġthe") to raw bytes (" the"); false when a character is outside the
// byte-level alphabet (such tokens can never come out of byte-level BPE).
bool ByteLevelDecode(std::string_view token, std::string* bytes);

}  // namespace tailserve::bpe_internal
