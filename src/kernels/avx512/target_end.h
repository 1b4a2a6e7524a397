// Closes target_begin.h.
#pragma GCC pop_options
