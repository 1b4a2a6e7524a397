# moe_own_mpi_session_dirs(): every test registered so far in the calling directory gets an Open
# MPI session directory of its own (OMPI_MCA_orte_tmpdir_base under the build tree). With the
# default, /tmp/ompi.<host>.<uid>, is created by the first mpiexec and removed by the last: two
# mpiexec that ctest -j starts in the same instant, with no other MPI job alive, both mkdir it, and
# Open MPI 4.1's launcher gives up on the one that loses ("A call to mkdir was unable to create the
# desired directory ... File exists", orte_session_dir failed, 0.03 s into the test): seen once in
# CI, on mpi_np4 beside mpi_np2. Tests that run no MPI carry the variable unused. Tests that
# gtest_discover_tests registers are not in the directory's list: the one suite of them that starts
# mpiexec (tests/unit/cli_step_mpi_test.cpp) gives it a directory in each test's temporary one.
function(moe_own_mpi_session_dirs)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t IN LISTS tests)
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT
                 "OMPI_MCA_orte_tmpdir_base=${PROJECT_BINARY_DIR}/mpi-sessions/${t}")
  endforeach()
endfunction()
