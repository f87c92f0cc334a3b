/* Error reporting: library functions return 0 on success or -1 on failure and
 * leave a message naming the file/field in a thread-local buffer. No exit() or
 * abort() in library code. */
#ifndef QLM_ERROR_H
#define QLM_ERROR_H

#if defined(__GNUC__)
#define QLM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define QLM_PRINTF(a, b)
#endif

/* Sets the error message and returns -1 so callers can `return qlm_errorf(...)`. */
int qlm_errorf(const char *fmt, ...) QLM_PRINTF(1, 2);
/* Prefixes the current message with more context ("loading X: <old message>"). */
int qlm_error_context(const char *fmt, ...) QLM_PRINTF(1, 2);
const char *qlm_last_error(void);
void qlm_clear_error(void);

#endif
