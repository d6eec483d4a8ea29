// What a loader finds in a checkpoint, as data. Checkpoint problems land here instead of being thrown, so
// that one load error can list them all and `nextn inspect` can show them without failing. A family adds
// what it describes about its checkpoints (naming forms, layouts) by deriving from LoadReport.
#pragma once
#include <string>
#include <vector>

namespace nextn {

struct LoadReport {
  std::vector<std::string> infos;     // worth one line each (no "nextn: info:" prefix)
  std::vector<std::string> warnings;  // e.g. one per unknown checkpoint tensor (skipped)
  std::vector<std::string> missing;   // canonical names of needed tensors nothing provided
  std::vector<std::string> errors;    // shape / dtype / quantization problems, each naming its tensor
  std::vector<std::string> notes;     // hints appended to the load error

  bool ok() const { return missing.empty() && errors.empty(); }
  // The text of the nextn::Error a failed load throws: the missing tensors (the first 40), the errors (the
  // first 40), then the notes, one per line.
  std::string error_message(const std::string& dir) const;
  // Prints the infos and warnings on stderr ("nextn: info: ..." / "nextn: warning: ..."), then throws
  // nextn::Error(error_message(dir)) unless ok().
  void print_or_throw(const std::string& dir) const;
};

}  // namespace nextn
