/* Hugging Face model folders as the transformer backend's weights: a
 * folder holding config.json and *.safetensors (F32, F16 or BF16), read
 * into a gguf_file built in memory (gguf.h, gguf_build_*) with the very
 * metadata keys and tensor names that llama.cpp's convert_hf_to_gguf.py
 * would write, so the backend reads both kinds of model the same way.
 *
 * config.json: architectures LlamaForCausalLM or MistralForCausalLM (or,
 * without architectures, model_type llama or mistral): a Llama decoder
 * without biases, with hidden_act silu, plain RoPE over whole heads
 * (rope_scaling null, no partial_rotary_factor, head_dim absent or
 * hidden_size / num_attention_heads) and no sliding window.  Anything else
 * is refused with a message naming the field.
 *
 * Safetensors: with model.safetensors.index.json, the files its weight_map
 * names; else model.safetensors; else every *.safetensors in the folder.
 * Each is mapped read-only and its header checked (offsets inside the file,
 * dtype, shape against byte span, shapes against config.json); an error
 * names the file and the tensor.  Matrices are used in place from the
 * mapping in their own dtype (the CPU kernels take F32, F16 and BF16
 * weights), except the rows of q_proj and k_proj, which are permuted into
 * memory of their own exactly as the converter does: per head, rows
 * [2, head_dim/2] become [head_dim/2, 2], so that RoPE on adjacent pairs
 * (K_ROPE_NORMAL, what the backend runs for GGUF llama files) computes
 * Hugging Face's rotate-half on the original weights (k_proj uses the KV
 * heads).  Norm weights are widened to f32 where stored narrower, as the
 * graph takes them.  lm_head.weight is dropped when tie_word_embeddings is
 * true; model.layers.N.self_attn.rotary_emb.inv_freq (old checkpoints) is
 * ignored; any other tensor is an error.
 *
 * Tokenizer: when tokenizer.json holds a byte-level BPE (GPT-2 alphabet,
 * no normalizer, no byte fallback), its vocabulary, added tokens and merges
 * become the tokenizer.ggml.* keys, with the token types llama.cpp gives
 * (added tokens marked special, or spelled <|...|>, control; other added
 * tokens user-defined; ids without a token "[PADn]", unused), and the
 * pre-tokenizer is recognised by its structure: Sequence[Digits(individual
 * digits), ByteLevel] is "smollm", ByteLevel alone "gpt2",
 * Sequence[Split(the Llama 3 regex), ByteLevel] "llama-bpe".  bos, eos,
 * add_bos_token and chat_template come from tokenizer_config.json (or
 * chat_template.jinja), the ids failing that from config.json.  A
 * tokenizer.json of another kind is recorded under tokenizer.ggml.model or
 * tokenizer.ggml.pre as a short description, which the tokenizer then
 * refuses by name: the model serves token ids only, and says why.  Without
 * tokenizer.json there are no tokenizer keys. */
#ifndef BATON_BACKENDS_TRANSFORMER_HF_H
#define BATON_BACKENDS_TRANSFORMER_HF_H

#include <stddef.h>
#include <stdint.h>

#include "backends/transformer/gguf.h"

/* Reads the folder DIR.  On success *OUT is a built gguf_file (release with
 * gguf_close; it owns the mappings and copies); on failure *OUT is NULL,
 * the status is returned and ERR[ERRLEN] (may be NULL) says what was wrong,
 * naming the file of the folder and the field or tensor. */
int hf_open(const char *dir, gguf_file **out, char *err, size_t errlen);

/* The tokenizer of the folder DIR alone: its tokenizer.json (and
 * tokenizer_config.json when present) as the tokenizer.ggml.* keys of a
 * built gguf_file, as hf_open reads them, for a model of N_VOCAB ids (the
 * rows of its embedding).  For models whose weights are no Llama's
 * (Whisper), whose text is encoded by the same byte-level BPE.  BT_ENOENT
 * without tokenizer.json; else as hf_open. */
int hf_tokenizer_open(const char *dir, int64_t n_vocab, gguf_file **out, char *err, size_t errlen);

/* What the transformer backend opens its `path` with: a folder, or a path
 * whose last component is config.json, goes to hf_open (the folder of that
 * config.json); anything else to gguf_open. */
int tf_weights_open(const char *path, gguf_file **out, char *err, size_t errlen);

#endif
