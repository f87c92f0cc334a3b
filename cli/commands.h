/* Entry points of the qlm subcommands (argv[0] is the subcommand name). */
#ifndef QLM_CLI_COMMANDS_H
#define QLM_CLI_COMMANDS_H

int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_rouge(int argc, char **argv);
int cmd_summarize(int argc, char **argv);
int cmd_lora(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_train(int argc, char **argv);

#endif
