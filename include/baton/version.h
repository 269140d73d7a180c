/* The version of baton's programs and libraries (batond --version,
 * batonctl --version). */
#ifndef BATON_VERSION_H
#define BATON_VERSION_H

#define BATON_VERSION "0.1.0"

#endif
