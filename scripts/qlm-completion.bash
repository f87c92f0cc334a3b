# Bash completion for qlm (`make install` puts it where bash-completion finds it; or source it):
# the commands, and each command's flags as its own --help lists them, so the list never goes stale.
_qlm() {
    local cur=${COMP_WORDS[COMP_CWORD]} qlm=${COMP_WORDS[0]}
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W "$("$qlm" --help 2>/dev/null | awk '/^  [a-z]/ { print $1 }') help" -- "$cur"))
    elif [ "$COMP_CWORD" -eq 2 ] && [ "${COMP_WORDS[1]}" = help ]; then
        COMPREPLY=($(compgen -W "$("$qlm" --help 2>/dev/null | awk '/^  [a-z]/ { print $1 }')" -- "$cur"))
    elif [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$("$qlm" "${COMP_WORDS[1]}" --help 2>/dev/null | grep -o -- '--[a-z][a-z0-9-]*' | sort -u)" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}
complete -o filenames -F _qlm qlm
