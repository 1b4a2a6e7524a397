// MOE_TEST_ASAN is defined when the test is built with AddressSanitizer (gcc's
// __SANITIZE_ADDRESS__ or clang's __has_feature): tests that read RSS or
// poisoning state check it.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define MOE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOE_TEST_ASAN 1
#endif
#endif
