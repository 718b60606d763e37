// SIGTERM and SIGINT while the ranks find each other. Training turns them into "save and stop"
// (InstallStopSignalHandler), but a rank still waiting at the rendezvous has nothing to save and
// would only notice the request after the rendezvous, if ever: until it completes, the signal ends
// the rank at once, with a line saying so.
#pragma once

namespace leantron::trainer {

// Called by `train` before it connects the process groups.
void BeginRendezvousPhase(int rank);
// Called when the process groups are connected: installs the training stop handler if
// BeginRendezvousPhase was called (and does nothing otherwise, e.g. in tests).
void EndRendezvousPhase();

}  // namespace leantron::trainer
