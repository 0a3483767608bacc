/* tessera — the one public header.
 *
 * The CLI and the server use only this header. Handles are opaque; the caller owns what it
 * created and frees it with the matching _free/_close. Every fallible call returns a ts_status
 * (TS_OK == 0); on error ts_last_error() gives one line naming the file, tensor, field or value
 * at fault. Errors are per thread. */
#ifndef TESSERA_H
#define TESSERA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TS_OK = 0,
    TS_ERR_IO = -1,          /* a file cannot be opened or read */
    TS_ERR_FORMAT = -2,      /* a file is malformed, truncated or inconsistent */
    TS_ERR_UNSUPPORTED = -3, /* well-formed but not something we run (architecture, dtype) */
    TS_ERR_NOMEM = -4,
    TS_ERR_INVALID = -5, /* a bad argument from the caller */
    TS_ERR_RANGE = -6,   /* a value outside its allowed range (e.g. context exceeded) */
    TS_ERR_CANCELLED = -7,
    TS_ERR_BUSY = -8,
} ts_status;

const char *ts_last_error(void);
const char *ts_status_name(ts_status st);

/* ---- models ---------------------------------------------------------------------------- */

typedef struct ts_model ts_model;

/* Opens a model: a directory with config.json + safetensors. The architecture is read from the
 * files and bound through the model factory. Weights are mmap'd, not copied. */
ts_status ts_model_open(const char *path, ts_model **out);
void ts_model_close(ts_model *model);

#define TS_MAX_MATRYOSHKA 16

/* The shorter lengths an embedding may be cut to (Matryoshka: its first values are a vector of
 * their own): n of them in len, n -1 any length, n 0 none. */
typedef struct {
    int n;
    int len[TS_MAX_MATRYOSHKA];
} ts_matryoshka;

/* How an input's hidden states become one vector (an embedding) */
typedef enum {
    TS_POOL_UNSET = 0, /* the model does not say */
    TS_POOL_LAST,      /* the last token's */
    TS_POOL_MEAN,      /* the mean over the tokens */
    TS_POOL_FIRST,     /* the first token's (sentence-transformers' "cls") */
} ts_pooling;

typedef struct {
    const char *arch;         /* factory name, e.g. "qwen35" */
    const char *weight_dtype; /* dtype of the bulk of the weights, e.g. "BF16" */
    int n_vocab;              /* rows of the output head */
    int n_embd;
    int n_layers;
    int n_ctx_train;
    int64_t n_params;      /* parameters of the text model */
    uint64_t weight_bytes; /* bytes of weights read per decoded token (roofline) */
    /* An encoder (EmbeddingGemma: bidirectional attention): it makes embeddings, never text.
     * Its forward takes each sequence's whole input in one call (every token sees the ones
     * after it) and writes hidden states only (ts_engine_forward_hidden). */
    bool encoder;
    ts_pooling pooling; /* the model's own pooling (its sentence-transformers Pooling module,
                         * a GGUF's pooling_type); TS_POOL_UNSET where it declares none */
    int n_embd_out;     /* width of its embeddings: after ts_model_embed_project */
    /* The lengths its embeddings were trained to be cut to, as config.json declares them the
     * way vLLM reads it: matryoshka_dimensions, or is_matryoshka true without a list (any). */
    ts_matryoshka matryoshka;
    /* It carries a multi-token-prediction block (Qwen3.5's `mtp.*`): ts_engine_draft */
    bool mtp;
} ts_model_info;

void ts_model_get_info(const ts_model *model, ts_model_info *info);

/* An embedding model's layers after the pooling (sentence-transformers' Dense modules; a GGUF's
 * dense_2 / dense_3), for n inputs at once: in, n rows of n_embd floats (pooled hidden states)
 * -> out, n rows of n_embd_out floats, in the model's order (each act(W x + b)); a copy where it
 * has none. Not normalized. */
ts_status ts_model_embed_project(const ts_model *model, int n, const float *in, float *out);
/* n inputs' embeddings from their pooled hidden states: ts_model_embed_project, then each row
 * scaled to unit length (a cosine is then a dot product). A row whose state is not a number
 * (activations that overflowed) comes out as NaN and the call says TS_ERR_RANGE, naming the
 * first: an error, never a vector of NaN passed on; the other rows are right. */
ts_status ts_model_embed_finish(const ts_model *model, int n, const float *pooled, float *out);

/* Writes a random checkpoint with the real shapes of a known size (config.json +
 * model.safetensors) into dir, for speed measurements. arch "qwen35", preset "0.8b" or "2b",
 * dtype "bf16", "f16" or "f32". */
ts_status ts_synth_write(const char *arch, const char *preset, const char *dtype, uint64_t seed,
                         const char *dir);

/* Writes the model at in (a Hugging Face directory or a GGUF file) as a GGUF file at out in
 * llama.cpp's conventions for its architecture, with weights of type "q8_0", "q4_0", "q4_k_m"
 * (llama.cpp's mixture), "f16", "bf16" or "f32"; with the tokenizer when in has a byte-level BPE
 * tokenizer.json. n_threads 0 = one per core. docs/GGUF.md. */
ts_status ts_quantize_model(const char *in, const char *out, const char *type, int n_threads);

/* ---- engine: sequences, state slots and the batched forward ----------------------------- */

typedef struct ts_engine ts_engine;

typedef enum { TS_ISA_AUTO, TS_ISA_SCALAR, TS_ISA_AVX2, TS_ISA_AVX512 } ts_isa;

/* Where the forward pass runs. CUDA needs a build with -DTESSERA_CUDA=ON and a GPU; otherwise
 * ts_engine_create fails with TS_ERR_UNSUPPORTED and says which is missing. */
typedef enum { TS_DEVICE_CPU, TS_DEVICE_CUDA } ts_device;

typedef struct {
    int n_slots;   /* sequences held at once (state allocated up front) */
    int n_ctx;     /* tokens per sequence, at most */
    int n_batch;   /* tokens per internal forward step; larger batches are split */
    int n_threads; /* 0 = one per core (CPU device) */
    ts_isa isa;    /* kernels to use; AUTO = best the CPU supports */
    ts_device device;
    /* prefix snapshots (ts_engine_snap_*): a pool of snap_bytes on the device, allocated at
     * creation, for up to n_snaps of them; 0: none */
    size_t snap_bytes;
    int n_snaps;
} ts_engine_opts;

void ts_engine_opts_default(ts_engine_opts *opts);
ts_status ts_engine_create(ts_model *model, const ts_engine_opts *opts, ts_engine **out);
void ts_engine_free(ts_engine *engine);
int ts_engine_n_vocab(const ts_engine *engine);
int ts_engine_n_ctx(const ts_engine *engine);

/* A batch is a list of tokens, each tagged with its sequence slot and position, and whether
 * its logits are wanted. Tokens of one slot must appear in increasing position order, and the
 * first one of a slot must continue that slot (position == tokens already held). One sequence
 * prefilling 500 tokens and eight sequences decoding one token each are the same call. */
typedef struct {
    int n_tokens;
    const int32_t *tokens;
    const int32_t *pos;
    const int32_t *slot;
    const uint8_t *wants_logits; /* NULL = only the last token of the batch */
    /* NULL, or per token NULL or n_embd floats (host memory) that stand in for the token's
     * embedding: an image's tokens carry the vision encoder's output (ts_engine_encode_image) */
    const float *const *embd;
    /* NULL, or 3 per token: its rotary positions (time, height, width) in a model with
     * multi-axis rotary positions (Qwen3.5's MRoPE); NULL = pos for all three. pos stays the
     * token's place in the sequence (its cache row): after an image the two differ. */
    const int32_t *rope_pos;
} ts_batch;

typedef struct ts_sampler ts_sampler; /* sampling, below */

/* Runs the model over the batch and writes n_vocab logits for each token whose logits are
 * wanted, in batch order, to logits (may be NULL when none are wanted). On every device the
 * work is done when it returns, with or without logits. */
ts_status ts_engine_forward(ts_engine *engine, const ts_batch *batch, float *logits);
/* The same forward, but for each token whose logits are wanted its final hidden state is
 * written instead, n_embd floats (ts_model_info) in batch order: the output of the final norm,
 * which the output head would turn into logits (the head does not run). What an embedding of
 * the text is pooled from. */
ts_status ts_engine_forward_hidden(ts_engine *engine, const ts_batch *batch, float *hidden);
/* The same forward, but for each token whose logits are wanted only the id of its largest
 * logit is written to ids (greedy decoding; the first id on ties). On a GPU the logits then
 * never leave the device. */
ts_status ts_engine_forward_greedy(ts_engine *engine, const ts_batch *batch, int32_t *ids);
/* The same forward, but for the k-th token whose logits are wanted the next token is drawn
 * with samplers[k] (made for this model's vocabulary) and written to ids[k]. On a GPU the draw
 * happens where the logits are (only a token id, or for top-k / top-p a short list of
 * candidates, comes back); the tokens are those ts_sampler_sample would draw from the logits,
 * from the same generator, up to float rounding where a draw falls on a boundary. */
ts_status ts_engine_forward_sample(ts_engine *engine, const ts_batch *batch,
                                   ts_sampler *const *samplers, int32_t *ids);
/* The same draws, and the wanted tokens' logits written to logits as ts_engine_forward writes
 * them, with each sampler's logit adjustments (ts_sampler_set_adjust) applied: what the draw
 * saw, for log-probabilities. On a GPU the draw stays where the logits are (the same tokens
 * as ts_engine_forward_sample); the logits come over as well. */
ts_status ts_engine_forward_sample_logits(ts_engine *engine, const ts_batch *batch,
                                          ts_sampler *const *samplers, int32_t *ids,
                                          float *logits);

/* Log-probabilities of a drawn token under the distribution its draw saw - the step's logits
 * with the sampler's adjustments, before temperature and filters: log softmax of those logits
 * (NaN and -inf entries have none) - and of the n_top most likely tokens, best first (the lower
 * id first on equal logits). */
#define TS_MAX_TOP_LOGPROBS 20
typedef struct {
    float logprob; /* the drawn token's */
    int n_top;
    int32_t top_id[TS_MAX_TOP_LOGPROBS];
    float top_logprob[TS_MAX_TOP_LOGPROBS];
} ts_logprobs;
/* The draws of ts_engine_forward_sample, and for the k-th drawn token its log-probabilities
 * with n_top (0 .. TS_MAX_TOP_LOGPROBS) alternatives in lps[k]: what ts_sampler_logprobs gives
 * for the adjusted logits. On a GPU they are computed where the logits are: a short list of
 * candidates and a sum come back, not the vocabulary (the values then agree with the host's up
 * to float rounding in the sum). */
ts_status ts_engine_forward_sample_logprobs(ts_engine *engine, const ts_batch *batch,
                                            ts_sampler *const *samplers, int n_top, int32_t *ids,
                                            ts_logprobs *lps);

/* Empties a slot (its sequence starts again at position 0). */
ts_status ts_engine_slot_clear(ts_engine *engine, int slot);
/* Tokens held by a slot. */
int ts_engine_slot_len(const ts_engine *engine, int slot);
/* Copies the state of slot src into slot dst: what its tokens use of it (the summed-up
 * state and the KV rows of its positions). */
ts_status ts_engine_slot_copy(ts_engine *engine, int src, int dst);
/* Prefix snapshots: a slot's state kept aside, in the pool ts_engine_opts.snap_bytes sets, at
 * the size its tokens take - the summed-up state (a hybrid model's conv and recurrent state)
 * and the KV rows of its positions, not the whole context - so that a short conversation's
 * takes little. Ids 0..n_snaps-1. ts_engine_snap_bytes: what a snapshot of len tokens takes of
 * the pool (0 without one); save replaces what snap held, and fails with TS_ERR_NOMEM, snap
 * then empty, when the pool has not the room (the caller drops others first); restore puts
 * it into a slot (its length becomes the snapshot's). ts_engine_snap_len: -1 when empty. */
size_t ts_engine_snap_bytes(const ts_engine *engine, int len);
size_t ts_engine_snap_pool_bytes(const ts_engine *engine);
ts_status ts_engine_snap_save(ts_engine *engine, int slot, int snap);
ts_status ts_engine_snap_restore(ts_engine *engine, int snap, int slot);
void ts_engine_snap_drop(ts_engine *engine, int snap);
int ts_engine_snap_len(const ts_engine *engine, int snap);
/* Taking tokens back (speculative decoding: tokens guessed ahead, run through the model, and
 * some found wrong). ts_engine_slot_mark remembers the slot's state at its present length;
 * ts_engine_slot_rewind then shortens the slot to len tokens, the mark's length <= len <= its
 * length, and sets *got to the length it holds: len where the model keeps its state per
 * position (attention: the rows past len are no longer read), else the mark's (a linear-
 * attention layer's state sums up every token, so it goes back to the mark's copy) - the
 * caller runs the tokens from *got to len again. A mark copies only that summed-up state (none
 * for an attention-only model); clearing or copying into the slot forgets it, and rewinding
 * keeps it. Without a mark a model with such state cannot rewind (TS_ERR_INVALID). */
ts_status ts_engine_slot_mark(ts_engine *engine, int slot);
ts_status ts_engine_slot_rewind(ts_engine *engine, int slot, int len, int *got);
/* Bytes of sequence state one slot holds for n_ctx tokens (KV cache + recurrent state): what a
 * snapshot costs, to size a prefix cache before creating the engine. */
size_t ts_model_state_bytes(const ts_model *model, int n_ctx);
/* What runs the engine, e.g. "cpu avx512 x2" (backend, kernel set, threads). */
const char *ts_engine_describe(const ts_engine *engine);

/* ---- LoRA adapters ------------------------------------------------------------------------
 * Low-rank corrections to the decoder layers' linear weights, applied as the model runs: with
 * adapter a at scale s a weight W [out, in] that it adapts reads x as W x + s * B_a (A_a x) (and
 * PEFT's lora_alpha / r inside B_a). The model's own weights never change, quantized or not.
 * ts_model_lora_load reads a PEFT directory (adapter_config.json + adapter_model.safetensors)
 * or a GGUF LoRA file (llama.cpp's convert_lora_to_gguf.py: not, for Qwen3.5, of its linear
 * attention) and gives its id (0, 1, ... in order of loading); an adapter trained on a model's
 * Hugging Face checkpoint fits that model's GGUF file too. Adapters are loaded before any engine is made for
 * the model (TS_ERR_INVALID after). Each slot has a scale for each adapter (all 0 at first:
 * none applied); ts_engine_slot_lora sets them for the slot's next tokens - a slot's state
 * computed under other scales is the caller's to clear - and ts_engine_slot_copy copies them
 * with the state. Sequences with different adapters share one forward. */
#define TS_MAX_LORA 16
ts_status ts_model_lora_load(ts_model *model, const char *path, int *id);
int ts_model_lora_count(const ts_model *model);
typedef struct {
    const char *path;
    int rank;      /* the largest of its pairs' (padded to a multiple of 16) */
    int n_weights; /* weights it adapts */
} ts_lora_info;
ts_status ts_model_lora_info(const ts_model *model, int id, ts_lora_info *out);
/* scales[0..n) for adapters 0..n-1 (n <= ts_model_lora_count); the others 0. */
ts_status ts_engine_slot_lora(ts_engine *engine, int slot, const float *scales, int n);

/* ---- Multi-token prediction: drafts for speculative decoding --------------------------------
 * A Qwen3.5 checkpoint's MTP block guesses the token after next from the model's last hidden
 * state and the next token (ts_model_info.mtp). ts_model_mtp_enable, before any engine is made
 * for the model (TS_ERR_INVALID after), makes its engines run the block on every forward, a
 * layer's work more a token, so that ts_engine_draft can guess: each slot's state then also
 * holds the block's KV rows and its last hidden state (ts_model_state_bytes grows).
 * ts_engine_draft: for each of n slots, tokens[i] is the token that follows what slots[i]
 * holds (not run yet); the block guesses the k tokens after it, greedily, into ids[i * k + j]
 * - and their logits into logits[(j * n + i) * n_vocab] unless NULL. rope_shift (NULL: none)
 * is each slot's rotary shift (text after images). The slots keep their lengths: the block's
 * rows it writes past a slot's length are rewritten when the tokens there run. A slot must
 * hold a token at least, and have room for k more. */
ts_status ts_model_mtp_enable(ts_model *model);
ts_status ts_engine_draft(ts_engine *engine, int n, const int32_t *slots, const int32_t *tokens,
                          const int32_t *rope_shift, int k, int32_t *ids, float *logits);

/* Measured read bandwidth of main memory with n_threads threads (0 = all cores), in GB/s:
 * the denominator of the decode roofline. Takes about a second. */
double ts_measure_read_bandwidth(int n_threads);
/* The same for the memory of CUDA device `device` (0 without CUDA or a GPU). */
double ts_measure_device_bandwidth(int device);

/* ---- text: tokenizer, streaming detokenizer, chat format ---------------------------------- */

typedef struct ts_tokenizer ts_tokenizer;

/* Opens path/tokenizer.json (path a model directory), path itself (a tokenizer.json file), or
 * the tokenizer in a GGUF file's metadata (byte-level BPE "gpt2" or SentencePiece "llama"; also
 * a directory whose only model file is a .gguf). tokenizer_config.json beside a tokenizer.json,
 * when present, tells the chat template's thinking default. */
ts_status ts_tokenizer_open(const char *path, ts_tokenizer **out);
void ts_tokenizer_free(ts_tokenizer *tok);
int ts_tokenizer_vocab_size(const ts_tokenizer *tok);
/* Encodes text into a malloc'd id array (caller frees). parse_special: whether added tokens
 * flagged special that appear in the text become their ids (raw prompts may opt in; chat
 * content never does). Invalid UTF-8 bytes are read as U+FFFD. A BOS is added when the
 * tokenizer asks for it (GGUF add_bos_token, e.g. Gemma). */
ts_status ts_tokenize(const ts_tokenizer *tok, const char *text, size_t len, bool parse_special,
                      int32_t **ids, size_t *n_ids);
/* The same without the BOS and EOS the tokenizer adds around a text: the text's own tokens
 * (llama-server's /tokenize without add_special). */
ts_status ts_tokenize_bare(const ts_tokenizer *tok, const char *text, size_t len,
                           bool parse_special, int32_t **ids, size_t *n_ids);
/* Decodes ids into a malloc'd NUL-terminated string (caller frees). */
ts_status ts_detokenize(const ts_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                        char **text, size_t *len);
/* The bytes token id stands for on its own, not NUL-terminated and possibly part of a UTF-8
 * character (a byte token); what the streaming detokenizer joins. Lives as long as tok; NULL
 * for an id outside the vocabulary. */
const char *ts_tokenizer_token_bytes(const ts_tokenizer *tok, int32_t id, size_t *len);
/* True for the tokens that end a generation (<|im_end|>, <|endoftext|>, <end_of_turn>, and a
 * GGUF's eos/eot ids). */
bool ts_tokenizer_is_eog(const ts_tokenizer *tok, int32_t id);
/* Whether the tokenizer's chat format has tools and tool calls of its own (Qwen3.5's; Gemma
 * 3's has none: with tools, ts_chat_tokenize writes its own form there - the tools and a call
 * form, a Python list of calls, in the first user turn - and an assistant's tool calls without
 * tools are TS_ERR_UNSUPPORTED). */
bool ts_tokenizer_chat_tools(const ts_tokenizer *tok);

/* Fill in the middle: the vocabulary's frame tokens (-1 where absent), from a GGUF's
 * tokenizer.ggml.fim_{pre,suf,mid,pad,rep,sep}_token_id or else by their Qwen spelling
 * (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>, <|fim_pad|>, <|repo_name|>, <|file_sep|>).
 * pad, repo and file_sep end a middle: a model trained on repositories writes them where the
 * hole is filled. */
typedef struct {
    int32_t prefix, suffix, middle, pad, repo, file_sep;
} ts_fim_tokens;
/* False where the vocabulary lacks the prefix, suffix or middle token (Gemma 3). */
bool ts_tokenizer_fim(const ts_tokenizer *tok, ts_fim_tokens *out);
/* The prompt of a fill-in-the-middle completion in the prefix-suffix-middle order Qwen's coder
 * models were trained on: [BOS where the tokenizer adds one] <|fim_prefix|> prefix
 * <|fim_suffix|> suffix <|fim_middle|>. The prefix is text, or ids taken as they are
 * (prefix_ids not NULL); texts are encoded as ts_tokenize does without parse_special (a
 * control token's spelling is text). TS_ERR_UNSUPPORTED without the frame tokens. */
ts_status ts_tokenize_fim(const ts_tokenizer *tok, const char *prefix, size_t prefix_len,
                          const int32_t *prefix_ids, size_t n_prefix_ids, const char *suffix,
                          size_t suffix_len, int32_t **ids, size_t *n_ids);
/* The same frame with a repository's other files before it and the middle's start after it
 * (llama-server's /infill): the repo-level pattern of Qwen2.5-Coder where the vocabulary has
 * <|repo_name|> and <|file_sep|> -
 *   [BOS] <|repo_name|> repo "\n" (<|file_sep|> name "\n" text)... <|file_sep|> file "\n"
 *   <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|> middle
 * (the repository line and the current file's only where files are given), else the files'
 * texts each after a "\n\n--- snippet ---\n\n" line. All texts without special parsing. */
typedef struct {
    const char *name, *text;
    size_t name_len, text_len;
} ts_fim_file;
typedef struct {
    const char *prefix, *suffix, *middle; /* NULL = "" */
    size_t prefix_len, suffix_len, middle_len;
    const ts_fim_file *files;
    int n_files;
    const char *repo, *file; /* the repository's and the current file's names ("" allowed) */
} ts_fim_frame;
/* n_context (not NULL): the frame's tokens before <|fim_prefix|> (the BOS and the files'
 * lines), which requests about the same files share. */
ts_status ts_tokenize_fim_frame(const ts_tokenizer *tok, const ts_fim_frame *f, int32_t **ids,
                                size_t *n_ids, size_t *n_context);

/* Streaming: feed ids one at a time, get back only whole UTF-8 characters. */
typedef struct ts_detokenizer ts_detokenizer;
ts_status ts_detokenizer_create(const ts_tokenizer *tok, bool skip_special, ts_detokenizer **out);
void ts_detokenizer_free(ts_detokenizer *d);
/* *text (not NUL-terminated, *len bytes) stays valid until the next call on d. */
ts_status ts_detokenizer_push(ts_detokenizer *d, int32_t id, const char **text, size_t *len);
ts_status ts_detokenizer_flush(ts_detokenizer *d, const char **text, size_t *len);
/* Whether the ids pushed so far end inside a character (bytes held for the next id). */
bool ts_detokenizer_mid_char(const ts_detokenizer *d);

/* A function call an assistant turn made. */
typedef struct {
    const char *name;
    const char *arguments_json; /* a JSON object (key order kept), or NULL for no arguments */
} ts_tool_call;

/* A piece of a message's content: text, or where text is NULL an image (or a video). */
typedef struct {
    const char *text;
    bool video;
} ts_content_part;
/* A video of a conversation as its prompt takes it (ts_video_plan): n_steps steps of
 * step_tokens video tokens each, step s preceded by the text "<seconds[s] seconds>" */
typedef struct {
    int n_steps, step_tokens;
    const double *seconds;
} ts_chat_video;
typedef struct {
    const char *role; /* "system", "user", "assistant" or "tool" */
    const char *content;          /* NULL: the parts below, or no content */
    const ts_content_part *parts; /* used when content is NULL */
    int n_parts;
    const char *reasoning_content;  /* assistant only, may be NULL */
    const ts_tool_call *tool_calls; /* assistant only, may be NULL */
    int n_tool_calls;
} ts_chat_message;

typedef struct {
    bool add_generation_prompt;
    int enable_thinking;    /* -1 = the model's default, 0 = off, 1 = on */
    const char *tools_json; /* a JSON array of tool schemas (objects), or NULL */
    /* the tokens each image of the conversation takes, in order (ts_image_plan.n_tokens): its
     * one image token of the template becomes that many; n_images must be the number of
     * image parts */
    const int *image_tokens;
    int n_images;
    /* the videos of the conversation, in order: each video part's one video token of the
     * template (between vision_start and vision_end) becomes its steps, as the Qwen3-VL
     * processor writes them; n_videos must be the number of video parts */
    const ts_chat_video *videos;
    int n_videos;
    /* the final message is left open for the answer to continue it (transformers'
     * continue_final_message, rendered as it renders it); needs add_generation_prompt false */
    bool continue_final;
} ts_chat_params;

/* Renders a conversation with the model's chat format and tokenizes it: the template's own
 * control tokens become special ids, message text is encoded with special-token matching off
 * (so user text cannot forge a turn). ids is malloc'd (caller frees). */
ts_status ts_chat_tokenize(const ts_tokenizer *tok, const ts_chat_message *msgs, int n,
                           const ts_chat_params *p, int32_t **ids, size_t *n_ids);

/* ---- images ------------------------------------------------------------------------------ */
/* An 8-bit RGB image: height rows top to bottom, width pixels each, 3 bytes a pixel. */
typedef struct {
    int width, height;
    uint8_t *rgb;
} ts_image;
/* The largest image ts_image_decode takes (a small file can declare a huge one). */
#define TS_IMAGE_MAX_SIDE 16384
#define TS_IMAGE_MAX_PIXELS (32 * 1024 * 1024)
/* Decodes a PNG, JPEG or WebP file held in memory (len bytes) into 8-bit RGB, as Hugging Face
 * image processors see it (PIL's decoders, then convert_to_rgb): grey and palette images
 * expanded, 16-bit samples reduced, an alpha channel composited over white. The orientation is
 * applied (rotated/mirrored upright, width and height swapped for 5..8) as transformers'
 * load_image does with PIL's exif_transpose: the EXIF Orientation (JPEG APP1, PNG eXIf or text
 * chunks, WebP EXIF chunk), else XMP's tiff:Orientation; damaged metadata is ignored, never an
 * error (src/image/README.md). TS_ERR_FORMAT naming the fault for a damaged file,
 * TS_ERR_UNSUPPORTED for another format, TS_ERR_RANGE for an image over the limits above,
 * TS_ERR_INVALID for NULL arguments. */
ts_status ts_image_decode(const void *data, size_t len, ts_image **out);
/* An image resized to width x height with a bicubic filter (a = -0.5) widened by the scale
 * factor when shrinking (antialiased), as PIL's Image.resize(BICUBIC) does, byte for byte.
 * TS_ERR_INVALID for no image or a side under 1, TS_ERR_RANGE over the limits above. */
ts_status ts_image_resize(const ts_image *src, int width, int height, ts_image **out);
void ts_image_free(ts_image *img);

/* ---- video: frames in ------------------------------------------------------------------- */
/* A video file's first video stream as Hugging Face's load_video (PyAV) sees it, before any
 * frame is decoded: its size, its frames (counted by reading every packet of the stream, not
 * taken from the header) and its average frame rate (0 when the file gives none). */
typedef struct {
    int width, height;
    int64_t n_frames;
    double fps;
} ts_video_info;
/* The most ts_video_probe takes: frames a stream, and frames times pixels (the decoding work,
 * since every frame up to the last one asked for is decoded). A side and a frame's pixels are
 * held to TS_IMAGE_MAX_SIDE and TS_IMAGE_MAX_PIXELS. */
#define TS_VIDEO_MAX_FRAMES 100000
#define TS_VIDEO_MAX_WORK   ((int64_t)1 << 34)
/* Reads a video file held in memory (MP4 / QuickTime, Matroska / WebM; decoded by the system's
 * libavformat and libavcodec, nothing outside the data ever opened) far enough to fill *out.
 * TS_ERR_UNSUPPORTED for another container or a codec not read, TS_ERR_FORMAT for a damaged
 * file or one without a video stream, TS_ERR_RANGE over the limits above. */
ts_status ts_video_probe(const void *data, size_t len, ts_video_info *out);
/* Decodes the frames at the n ascending indices (frame 0 is the stream's first), each turned
 * into 8-bit RGB as PyAV's to_ndarray("rgb24") turns it and resized to width x height with
 * ts_image_resize (no resize where the size is the frame's own), into frames[0..n). The
 * stream's display rotation is not applied (Hugging Face applies none). TS_ERR_FORMAT when the
 * stream ends before an index or a frame cannot be decoded; on error frames[] holds nothing. */
ts_status ts_video_decode(const void *data, size_t len, const int64_t *indices, int n, int width,
                          int height, ts_image **frames);

/* ---- vision: images in a prompt ---------------------------------------------------------- */
/* How a model with a vision tower takes images: each image is resized to multiples of
 * patch_size * merge_size pixels within [min_pixels, max_pixels] (aspect ratio kept), cut into
 * patches, and enters the prompt as vision_start, one image_token per merge_size^2 patches,
 * vision_end; the tower's output rows stand in for the image tokens' embeddings. */
typedef struct {
    int patch_size, merge_size;
    int64_t min_pixels, max_pixels;
    int32_t image_token, vision_start, vision_end;
    /* Videos (Hugging Face's Qwen3-VL video processor; ts_video_plan): frames sampled at
     * video_fps a second (at least video_min_frames, at most video_max_frames), every frame
     * resized alike so that all of them together hold video_min_pixels..video_max_pixels, cut
     * into steps of temporal_patch_size frames. video_max_frame_tokens > 0 caps each frame's
     * share first (the processor's cap_pixels_per_frame with max_video_tokens). video_token < 0:
     * the model takes no videos; video_refused then says why when the checkpoint would take
     * them but asks for what is not supported (its images still work), else it is "". */
    int32_t video_token;
    char video_refused[192];
    int temporal_patch_size;
    int64_t video_min_pixels, video_max_pixels;
    double video_fps;
    int video_min_frames, video_max_frames;
    int video_max_frame_tokens;
} ts_vision_info;
/* Whether the model reads images (a vision tower was loaded); if so, fills *out (may be NULL). */
bool ts_model_vision(const ts_model *model, ts_vision_info *out);
/* One image's way into the model. */
typedef struct {
    int width, height;  /* the size it is resized to */
    int grid_h, grid_w; /* patches */
    int n_tokens;       /* image tokens in the prompt: grid_h * grid_w / merge_size^2 */
    bool video;         /* one step of a video: its tokens are video_token, not image_token */
} ts_image_plan;
/* The plan for an image of width x height: Hugging Face's Qwen2-VL smart_resize (sides rounded
 * to the nearest multiple, then scaled down or up into the pixel range). TS_ERR_RANGE for an
 * aspect ratio over 200 or a side under 1. */
ts_status ts_vision_plan(const ts_vision_info *v, int width, int height, ts_image_plan *out);
/* How a video enters the model (Hugging Face's Qwen3-VL video processor and processor,
 * specs/models.md C.5): the frames sampled (indices into the stream, ascending), the size every
 * frame is resized to, and its steps of temporal_patch_size frames (the last frame repeated to
 * fill the last step). Each step enters the prompt as the text "<S seconds>" (S: the mean time
 * of the step's frames, one decimal) then vision_start, step.n_tokens video tokens, vision_end;
 * the tower encodes each step's frames together (ts_engine_encode_frames). */
typedef struct {
    ts_image_plan step; /* each step's size, grid and tokens; step.video is true */
    int n_frames;       /* frames sampled */
    int n_steps;        /* steps: n_frames / temporal_patch_size, rounded up */
    int64_t *indices;   /* [n_frames] */
    double *seconds;    /* [n_steps] */
} ts_video_plan;
/* The plan of a video: HF's sample_frames (fps frames a second of the stream's average rate, 24
 * where the file gives none; clamped to [min_frames, max_frames] and the stream's frames;
 * np.linspace(0, frames - 1, n).round()) and the video smart_resize. fps > 0 replaces the
 * model's video_fps. TS_ERR_UNSUPPORTED for a model that takes no videos, TS_ERR_RANGE for a
 * video of fewer frames than a step or outside the size limits. */
ts_status ts_video_plan_make(const ts_vision_info *v, const ts_video_info *video, double fps,
                             ts_video_plan *out);
void ts_video_plan_free(ts_video_plan *p);
/* A video file all the way to what the tower takes: probed, planned (ts_video_plan_make, fps as
 * there) and its sampled frames decoded at the plan's size, n_steps * temporal_patch_size of
 * them, the last frame repeated to fill a short last step (*frames malloc'd; free each with
 * ts_image_free, then the array, and the plan with ts_video_plan_free). The errors of the
 * three. */
ts_status ts_video_load(const void *data, size_t len, const ts_vision_info *v, double fps,
                        ts_video_plan *plan, ts_image ***frames);
/* The rotary positions of a prompt holding images (Qwen3.5's MRoPE, specs/models.md C.7): for
 * each of the n tokens its (time, height, width) positions, 3 ints, into rope_pos; each run of
 * image tokens is the next image of plans (n_images of them, in order; a run's length must be
 * that image's n_tokens). A video's steps are plans of their own (video true), their runs of
 * video tokens taken as images are. *delta gets what every later token adds to its place in the
 * sequence (its rotary positions are pos + delta): a decode step's rope_pos. TS_ERR_INVALID when
 * the runs and the plans disagree. */
ts_status ts_vision_rope_positions(const ts_vision_info *v, const int32_t *ids, int n,
                                   const ts_image_plan *plans, int n_images, int32_t *rope_pos,
                                   int32_t *delta);
/* Runs the vision tower over an image (resized here to plan's size; plan NULL: the model's own
 * plan for it, ts_vision_plan) and writes the plan's n_tokens rows of n_embd floats to out: the
 * embeddings of its image tokens (ts_batch.embd). TS_ERR_UNSUPPORTED for a model without a
 * vision tower or a backend that runs none (ts_engine_vision), TS_ERR_RANGE where the output is
 * not finite (a device that failed). */
ts_status ts_engine_encode_image(ts_engine *engine, const ts_image *img, const ts_image_plan *plan,
                                 float *out);
/* The same for one step of a video: its frames (temporal_patch_size of them, each resized to
 * the plan's size; frames repeat where the video's last step is short) encoded together. */
ts_status ts_engine_encode_frames(ts_engine *engine, const ts_image *const *frames, int n_frames,
                                  const ts_image_plan *plan, float *out);
/* Whether the engine takes images: its model has a vision tower and its device runs it. */
bool ts_engine_vision(const ts_engine *engine);

/* ---- sampling --------------------------------------------------------------------------- */

typedef struct {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
    float min_p;       /* 0 = off */
    uint64_t seed;
} ts_sampler_params;

void ts_sampler_params_default(ts_sampler_params *p);
ts_status ts_sampler_create(const ts_sampler_params *p, int n_vocab, ts_sampler **out);
void ts_sampler_free(ts_sampler *s);
/* Picks the next token from a row of n_vocab logits. Deterministic for a given seed and
 * sequence of calls. */
int32_t ts_sampler_sample(ts_sampler *s, const float *logits);
/* A change to one token's logit before a draw: v = l + bias; then the repetition penalty,
 * v = v > 0 ? v / rep : v * rep, where rep is a positive finite number other than 1 (else
 * none); then l = v - sub. The server's logit_bias is the bias, its repetition penalty the rep
 * of the tokens already in the prompt or the answer, its frequency and presence penalties the
 * sub (the order of llama.cpp's and vLLM's samplers: the bias before the penalties). */
typedef struct {
    int32_t id;
    float bias, rep, sub;
} ts_logit_adjust;

/* Applies the n entries of adj to a row of n_vocab logits, in order; entries whose id is
 * outside the row are skipped. The host's and the devices' draws apply them with these float
 * operations. */
void ts_logit_adjust_apply(const ts_logit_adjust *adj, int n, float *logits, int n_vocab);

/* Logit adjustments for the draws of ts_engine_forward_sample that follow (applied to the step's
 * logits where they are, before temperature), until set again: the n entries of adj (distinct
 * ids; the array is read at each draw, so it must stay valid and may grow between draws).
 * n = 0 removes them. ts_sampler_sample never applies them: its caller owns the logits. */
void ts_sampler_set_adjust(ts_sampler *s, const ts_logit_adjust *adj, int n);

/* log(sum_i exp(logits[i])) over a row of n_vocab logits (NaN entries left out), for
 * log-probabilities: the CPU's vector exp in float, within ~1e-6 of a float64 sum. */
double ts_sampler_logsumexp(ts_sampler *s, const float *logits);
/* The k best entries of a row of n_vocab logits, for log-probabilities' alternatives: their ids
 * and logits into ids[] and vals[], by logit and then the lower id first; NaN and -inf never.
 * Returns how many (fewer than k when the row has fewer candidates). */
int ts_sampler_top(ts_sampler *s, const float *logits, int k, int32_t *ids, float *vals);
/* Token id's log-probability in a row of n_vocab logits and the n_top (at most
 * TS_MAX_TOP_LOGPROBS) best alternatives' (ts_sampler_logsumexp, ts_sampler_top). */
void ts_sampler_logprobs(ts_sampler *s, const float *logits, int32_t id, int n_top,
                         ts_logprobs *out);

/* ---- thinking budget --------------------------------------------------------------------- */

/* Bounds a generation's thinking (its tokens between <think> and </think>): once it has thought
 * `budget` tokens, the caller's `end` (a message's tokens, then </think>) is put in, a token a
 * step, in place of the draws, and the generation goes on after it. Not inside a character: a
 * budget that runs out where the text so far ends inside one waits for up to 3 more tokens
 * (the most a character can still need). Thinking opened again later counts on from where it
 * stopped. The caller draws as usual and takes ts_think_budget_forced's token instead where
 * there is one, then hands every token out to ts_think_budget_token. */
typedef struct {
    int32_t open, close; /* the tags' ids */
    int budget;          /* tokens of thinking; -1: no bound */
    const int32_t *end;  /* borrowed: n_end tokens, ending in close */
    int n_end;
    bool thinking; /* inside <think> */
    int thought;   /* tokens thought so far */
    int end_at;    /* the next of end's tokens to put in; -1: none */
} ts_think_budget;
/* thinking: the prompt ends inside <think> (a budget of 0 then puts the end in first). No
 * bound where budget < 0, n_end == 0 or the tags are not tokens (open or close < 0). */
void ts_think_budget_init(ts_think_budget *b, int32_t open, int32_t close, int budget,
                          const int32_t *end, int n_end, bool thinking);
/* The token the next draw must give; -1 when the draw is free. */
int32_t ts_think_budget_forced(const ts_think_budget *b);
/* After each token out (id), the text so far ending inside a character or not (mid_char:
 * ts_detokenizer_mid_char). */
void ts_think_budget_token(ts_think_budget *b, int32_t id, bool mid_char);

/* ---- constrained decoding --------------------------------------------------------------- */

/* A grammar the generated text must follow (immutable once made; may be shared by threads). */
typedef struct ts_grammar ts_grammar;
/* The grammar of JSON text valid against a JSON Schema (schema: its JSON text, len bytes), or of
 * any JSON object when schema is NULL (OpenAI's JSON mode). The text may start with whitespace
 * and ends with the value. Keywords that constrain values and are not implemented are refused
 * (TS_ERR_UNSUPPORTED naming the keyword and where it is); docs/API.md lists what is kept. */
ts_status ts_grammar_from_json_schema(const char *schema, size_t len, ts_grammar **out);
/* A grammar in GBNF, llama.cpp's notation (len bytes of text; docs/API.md says what is read);
 * TS_ERR_INVALID naming the line and column of a mistake. */
ts_status ts_grammar_from_gbnf(const char *text, size_t len, ts_grammar **out);
/* Plain text that a regular expression matches whole (vLLM's guided_regex): the ECMA-262
 * subset of JSON Schema's `pattern` (docs/API.md), every character written as itself. */
ts_status ts_grammar_from_regex(const char *pattern, size_t len, ts_grammar **out);
/* Exactly one of the n strings, as written (vLLM's guided_choice). */
ts_status ts_grammar_from_choices(const char *const *choices, int n, ts_grammar **out);
/* A copy of g that lives on its own (each of a request's n answers owns one). */
ts_status ts_grammar_copy(const ts_grammar *g, ts_grammar **out);
void ts_grammar_free(ts_grammar *g);

/* A tokenizer's vocabulary as bytes, arranged for finding the tokens a grammar allows. Special
 * tokens never match text (the end-of-generation ones are allowed where the text may end); the
 * n_exclude ids of exclude never match either (e.g. tokens the caller reads as markers). */
typedef struct ts_grammar_vocab ts_grammar_vocab;
ts_status ts_grammar_vocab_create(const ts_tokenizer *tok, const int32_t *exclude, int n_exclude,
                                  ts_grammar_vocab **out);
void ts_grammar_vocab_free(ts_grammar_vocab *v);

/* Where one generation stands in a grammar. */
typedef struct ts_grammar_matcher ts_grammar_matcher;
ts_status ts_grammar_matcher_create(const ts_grammar *g, const ts_grammar_vocab *v,
                                    ts_grammar_matcher **out);
void ts_grammar_matcher_free(ts_grammar_matcher *m);
/* Whether token id may come next. */
bool ts_grammar_matcher_allows(ts_grammar_matcher *m, int32_t id);
/* Sets the logits of every token that may not come next to -INFINITY in a row of n (the model's
 * vocabulary, which may be longer than the tokenizer's: the ids past it never may);
 * TS_ERR_INVALID when no token may. */
ts_status ts_grammar_matcher_mask(ts_grammar_matcher *m, float *logits, int n);
/* Takes token id; TS_ERR_INVALID (nothing changes) when it may not come next. */
ts_status ts_grammar_matcher_accept(ts_grammar_matcher *m, int32_t id);
/* The text so far is complete (a sentence of the grammar)... */
bool ts_grammar_matcher_can_end(const ts_grammar_matcher *m);
/* ...and nothing may follow it. */
bool ts_grammar_matcher_done(const ts_grammar_matcher *m);

#ifdef __cplusplus
}
#endif

#endif
