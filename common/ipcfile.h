/* The socket file behind an ipc:// endpoint: where it lives, and whether a
 * process listens on it.
 *
 * ZeroMQ binds an ipc:// endpoint by unlinking whatever file is at its path
 * first, and leaves the file behind when the process goes.  Both ends need
 * to tell the cases apart: batond, so that it neither takes the socket of a
 * batond that is running nor trips over the file of one that stopped; and
 * batonctl, so that it can say at once that nobody serves an endpoint
 * instead of waiting for a connection that cannot come. */
#ifndef BATON_COMMON_IPCFILE_H
#define BATON_COMMON_IPCFILE_H

typedef enum bt_ipcfile_state {
    BT_IPCFILE_ABSENT,    /* no file at the path (or a folder of it is missing) */
    BT_IPCFILE_LISTENING, /* a process accepts connections on it */
    BT_IPCFILE_STALE,     /* a socket file nobody listens on: a leftover */
    BT_IPCFILE_UNKNOWN    /* anything else: not a socket, no permission, path too long */
} bt_ipcfile_state;

/* The file system path of an ipc:// ENDPOINT (a pointer into it), or NULL
 * for another transport or an abstract socket (ipc://@name), which has no
 * file. */
const char *bt_ipcfile_path(const char *endpoint);

/* What is at PATH, found by connecting to it (the connection is closed at
 * once).  errno is kept from the probe for BT_IPCFILE_UNKNOWN. */
bt_ipcfile_state bt_ipcfile_probe(const char *path);

#endif
