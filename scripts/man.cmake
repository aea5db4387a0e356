# fsdpc.1: `fsdpc --help` rendered as a man page (cmake -DFSDPC=... -DOUT=... -DVERSION=... -P man.cmake).
execute_process(COMMAND ${FSDPC} --help OUTPUT_VARIABLE help RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fsdpc --help failed: ${rc}")
endif()
string(REPLACE "\\" "\\e" help "${help}")   # roff's escape character
string(REGEX REPLACE "\n\\." "\n\\\\&." help "${help}")  # a line starting with '.' is not a request
file(WRITE ${OUT}.tmp
".TH FSDPC 1 \"\" \"fsdpc ${VERSION}\" \"User Commands\"
.SH NAME
fsdpc \\- compile an ONNX model into a Fully Sharded Data Parallel training executable
.SH SYNOPSIS
.B fsdpc
\\fIMODEL.onnx\\fR \\fB\\-o\\fR \\fIOUT\\fR \\fB\\-\\-loss\\fR \\fIKIND:PRED,TARGET\\fR [\\fIoptions\\fR]
.br
.B mpirun \\-np
\\fIN\\fR \\fIOUT\\fR [\\fIrun options\\fR] (\\fIOUT\\fR \\fB\\-\\-help\\fR lists them)
.SH OPTIONS
.nf
${help}.fi
.SH FILES
The runtime's libraries and headers: \\fIPREFIX\\fR/lib/fsdpc and \\fIPREFIX\\fR/include/fsdpc, found from the
installed \\fIPREFIX\\fR/bin/fsdpc, or from \\fBFSDPC_HOME\\fR (an install prefix) when it is set.
.SH SEE ALSO
README.md in the fsdpc sources.
")
file(RENAME ${OUT}.tmp ${OUT})
