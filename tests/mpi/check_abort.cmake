# Runs mpi_abort_demo under mpiexec (cmake -DMPIEXEC=... -DRANKS=... -DDEMO=... -P this file)
# and checks that the job, where rank 1 fails while the others wait in a barrier, ends with a
# non-zero status well before the limit instead of hanging.
set(limit_seconds 60)
set(prompt_seconds 30)

string(TIMESTAMP start "%s")
execute_process(
  COMMAND ${MPIEXEC} -n ${RANKS} ${DEMO}
  RESULT_VARIABLE status
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output
  TIMEOUT ${limit_seconds})
string(TIMESTAMP end "%s")
math(EXPR elapsed "${end} - ${start}")
message(STATUS "mpiexec ended with status '${status}' after ${elapsed} s; output:\n${output}")

if(NOT status MATCHES "^[0-9]+$")
  message(FATAL_ERROR "mpiexec did not exit by itself: ${status}")
endif()
if(status EQUAL 0)
  message(FATAL_ERROR "the job ended with status 0 although rank 1 failed")
endif()
if(elapsed GREATER ${prompt_seconds})
  message(FATAL_ERROR "the job took ${elapsed} s to end after the failure (limit ${prompt_seconds} s)")
endif()
if(NOT output MATCHES "rank 1: fatal: rank 1 failed on purpose")
  message(FATAL_ERROR "the failing rank's message is missing from the output")
endif()
if(output MATCHES "passed a barrier")
  message(FATAL_ERROR "a rank passed the barrier without rank 1")
endif()
