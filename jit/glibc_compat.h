// Keeps kjit's binaries loadable with GCC 11's libstdc++, for the Python wheel's manylinux tag.
//
// The one symbol of kjit's that needs a libstdc++ newer than GCC 11's: GCC 12's headers bind
// condition_variable::wait(unique_lock&) to GLIBCXX_3.4.30, which alone would lift the Python
// wheel's manylinux tag from 2_34 (GLIBCXX_3.4.29 at most) to 2_35
// (scripts/package/build-wheel.sh). The same function under its first version, GLIBCXX_3.4.11, is
// in every libstdc++ since GCC 4.4; the two differ only for a thread cancelled with pthread_cancel
// while it waits, which kjit never does.
//
// A .symver directive binds only the references of the object file it is assembled into, so this
// is a header: a source file that waits on a std::condition_variable includes it.
#pragma once

#if defined(__GLIBCXX__) && defined(__ELF__)
__asm__(
    ".symver _ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE,"
    "_ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE@GLIBCXX_3.4.11");
#endif
