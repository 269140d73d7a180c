/* OpenAI's chat completions and (legacy) completions APIs in baton's
 * terms: parsing a request body (jansson) into what a native request needs,
 * and writing the answers (whole, or as server-sent events).  No I/O here:
 * gateway.c serves it. */
#ifndef BATON_DAEMON_OPENAI_H
#define BATON_DAEMON_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OA_MAX_STOP 4            /* stop strings a request may give (OpenAI's limit) */
#define OA_MAX_STOP_BYTES 256    /* bytes in one stop string */
#define OA_COMPLETION_MAX_TOKENS 16 /* a completion's max_tokens when not given (OpenAI's) */

/* One turn of the conversation. */
typedef struct oa_msg {
    const char *role;       /* "system", "user" or "assistant" (static strings) */
    char *content;          /* owned: the turn's text */
} oa_msg;

/* A chat completion or completion request, checked. */
typedef struct oa_chat {
    char *model;            /* owned: the name the client asked for */
    oa_msg *msgs;           /* owned: the conversation, in order (chat) */
    size_t n_msgs;
    char *prompt;           /* owned: the text to go on from (completion); NULL for a chat */
    uint32_t max_tokens;    /* 0: not given (the graph's own cap) */
    float temperature;      /* OpenAI's default is 1 */
    float top_p;            /* 1: no cut */
    uint32_t top_k;         /* 0: no cut (an extension, as vLLM's) */
    uint64_t seed;          /* 0: not given */
    bool stream;
    bool include_usage;     /* stream_options.include_usage: a last event with the usage */
    char *stop[OA_MAX_STOP];  /* owned: strings the answer stops before (not included) */
    size_t n_stop;
    /* An {"type": "input_audio"} part of a message (at most one per
     * request): its file's bytes, decoded from base64. */
    uint8_t *audio;         /* owned; NULL: none */
    size_t audio_len;       /* bytes */
    size_t audio_msg;       /* the index in MSGS of the message that holds it */
} oa_chat;

/* Parses BODY (LEN bytes).  0, or BT_EINVAL with ERR saying what is wrong
 * and PARAM (may be "") naming the field, in OpenAI's terms.  A message's
 * content may hold one {"type": "input_audio", "input_audio": {"data":
 * BASE64, "format": "wav"}} part in the whole request (wav, mp3, flac,
 * ogg); whether the model takes it is the caller's to say. */
int oa_chat_parse(const char *body, size_t len, oa_chat *out, char *err, size_t errlen,
                  char *param, size_t paramlen);
/* The same for POST /v1/completions: prompt (one string), max_tokens
 * (default OA_COMPLETION_MAX_TOKENS), the sampling fields, stop, stream,
 * stream_options, n (1), user; echo only false, logprobs only null. */
int oa_completion_parse(const char *body, size_t len, oa_chat *out, char *err, size_t errlen,
                        char *param, size_t paramlen);
void oa_chat_free(oa_chat *c);

/* Tokens of an answer. */
typedef struct oa_usage {
    uint32_t prompt;        /* the prompt's tokens, as the model counted them */
    uint32_t completion;    /* tokens of the output stream taken (at most max_tokens) */
    uint32_t cached;        /* of PROMPT, tokens read from a prefix cache */
} oa_usage;

/* The whole answer: {"id", "object": "chat.completion", "created", "model",
 * "choices": [{"index": 0, "message": {"role": "assistant", "content":
 * TEXT}, "finish_reason": FINISH}], "usage": {"prompt_tokens",
 * "completion_tokens", "total_tokens"}}.  Malloc'd, or NULL. */
char *oa_chat_response(const char *id, int64_t created, const char *model, const char *text,
                       size_t len, const char *finish, const oa_usage *usage);
/* The same with "transcript": HEARD, the text of the audio the request's
 * message held (a voice model's answer; an extension of OpenAI's shape). */
char *oa_voice_response(const char *id, int64_t created, const char *model, const char *text,
                        size_t len, const char *finish, const oa_usage *usage,
                        const char *heard, size_t heard_len);
/* A stream's piece of that transcript: a chat.completion.chunk with no
 * choices and "transcript": HEARD (LEN bytes); the pieces in order are the
 * transcript.  Malloc'd, or NULL. */
char *oa_transcript_event(const char *id, int64_t created, const char *model, const char *heard,
                          size_t len);

/* The last event of a stream that asked for it (stream_options
 * include_usage): a chunk with no choices and the usage. */
char *oa_chat_usage_event(const char *id, int64_t created, const char *model,
                          const oa_usage *usage);

/* A completion's whole answer: {"id", "object": "text_completion",
 * "created", "model", "choices": [{"text", "index": 0, "logprobs": null,
 * "finish_reason"}], "usage"}.  Malloc'd, or NULL. */
char *oa_completion_response(const char *id, int64_t created, const char *model,
                             const char *text, size_t len, const char *finish,
                             const oa_usage *usage);
/* One event of a completion's stream: "data: {...}\n\n", the same object
 * with the text so far's next piece and FINISH (or null). */
char *oa_completion_event(const char *id, int64_t created, const char *model, const char *text,
                          size_t len, const char *finish);
/* Its usage event: "choices": [] and the usage. */
char *oa_completion_usage_event(const char *id, int64_t created, const char *model,
                                const oa_usage *usage);

/* One server-sent event of a stream: "data: {chunk}\n\n".  ROLE_FIRST puts
 * the assistant role in the delta (the first event); FINISH (or NULL) ends
 * the choice.  Malloc'd, or NULL. */
char *oa_chat_event(const char *id, int64_t created, const char *model, const char *text,
                    size_t len, bool role_first, const char *finish);

/* The list of /v1/models for NAMES. Malloc'd, or NULL. */
char *oa_models(const char *const *names, size_t n, int64_t created);

/* How many of the LEN bytes at S to send now: up to the last whole UTF-8
 * character, so that a character split over two tokens is sent whole with
 * the second.  At the end (FINAL) everything. */
size_t oa_utf8_ready(const char *s, size_t len, bool final);

/* An error body: {"error": {"message", "type", "param", "code"}}. */
char *oa_error(const char *message, const char *type, const char *param);

/* ---- audio: POST /v1/audio/transcriptions and /v1/audio/translations ---- */

/* The response formats of the audio endpoints. */
typedef enum oa_audio_format {
    OA_AUDIO_JSON = 0,      /* {"text"} */
    OA_AUDIO_TEXT,          /* the text as text/plain */
    OA_AUDIO_SRT,           /* SubRip subtitles */
    OA_AUDIO_VTT,           /* WebVTT subtitles */
    OA_AUDIO_VERBOSE_JSON   /* {"task", "language", "duration", "text", "segments"} */
} oa_audio_format;

/* The format called NAME; -1 when there is none. */
int oa_audio_format_of(const char *name);

/* The whole answer in FORMAT, with its content type in *CTYPE.  TEXT (LEN
 * bytes) is the transcript, SEGS (SEGS_LEN bytes, may be NULL) its
 * segments as JSON lines {"start", "end", "text", ...} in seconds, which
 * give verbose_json its segments and srt and vtt their cues (without them,
 * one span over the whole audio), DURATION the audio's seconds (< 0:
 * unknown), TASK "transcribe" or "translate", LANGUAGE the code asked for
 * ("": the one the first segment's "language" says the model detected).
 * Malloc'd, or NULL. */
char *oa_audio_response(oa_audio_format format, const char *text, size_t len, const char *segs,
                        size_t segs_len, double duration, const char *task, const char *language,
                        const oa_usage *usage, const char **ctype);

/* A streamed piece: data: {"type": "transcript.text.delta", "delta"}, and
 * the end: data: {"type": "transcript.text.done", "text", "usage"}. */
char *oa_audio_delta_event(const char *text, size_t len);
char *oa_audio_done_event(const char *text, size_t len, const oa_usage *usage);

#endif
