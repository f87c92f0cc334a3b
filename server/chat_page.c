/* The chat page served at GET /: chat_page.html (plain HTML and JavaScript, no external resources)
 * assembled into the binary as one NUL-ended string, so the binary alone serves it and the page
 * stays an ordinary file to edit. The assembler reads the file relative to the repository root,
 * where make runs; the Makefile makes this object depend on it. */
#include "internal.h"

__asm__(".section .rodata\n"
        ".global qlm_chat_page\n"
        ".type qlm_chat_page, @object\n"
        "qlm_chat_page:\n"
        ".incbin \"server/chat_page.html\"\n"
        ".byte 0\n"
        ".size qlm_chat_page, . - qlm_chat_page\n"
        ".previous\n");
