/*
 * Hadoop's local file system for a streaming query's checkpoint on the local disk, with
 * permissions set through Java instead of a new process per file.
 *
 * Without Hadoop's native library, which a pip-installed PySpark lacks, Hadoop's local file
 * system sets the permission of every file and directory it creates by running `chmod` in a
 * new process: a small streaming query's first micro-batch ran 73 of them (its offsets and
 * commits, each stateful operator's schema and metadata files, each state store's snapshot
 * files), each a process the JVM forks. This one sets them with java.nio. It writes no
 * `.crc` checksum files either (it is Hadoop's raw local file system, under its own scheme),
 * and reads back files that Hadoop's checksummed local file system wrote all the same. Spark
 * writes each checkpoint file to a temporary name and renames it over the final one: a rename
 * or a delete here also removes the final file's old checksum, where Hadoop's `file:` file
 * system left one, so that a later query over `file:` does not check the new file against it.
 *
 * The runner names a local checkpoint directory with this scheme (`beamlocal:/path`);
 * everything else keeps Hadoop's `file:` file system. See
 * beam_spark_runner/streaming/checkpoint_files.py.
 */
package beam_spark_runner.jvm;

import java.io.IOException;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class LocalCheckpointFileSystem extends RawLocalFileSystem {
  public static final String SCHEME = "beamlocal";
  private static final URI NAME = URI.create(SCHEME + ":///");
  // Permission bits from the lowest (others' execute) to the highest (the owner's read).
  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE,
    PosixFilePermission.OTHERS_WRITE,
    PosixFilePermission.OTHERS_READ,
    PosixFilePermission.GROUP_EXECUTE,
    PosixFilePermission.GROUP_WRITE,
    PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE,
    PosixFilePermission.OWNER_WRITE,
    PosixFilePermission.OWNER_READ,
  };

  @Override
  public URI getUri() {
    return NAME;
  }

  @Override
  public String getScheme() {
    return SCHEME;
  }

  /** The permission's nine read, write and execute bits (not the sticky bit). */
  static Set<PosixFilePermission> posix(FsPermission permission) {
    short mode = permission.toShort();
    Set<PosixFilePermission> bits = EnumSet.noneOf(PosixFilePermission.class);
    for (int bit = 0; bit < BITS.length; bit++) {
      if ((mode & (1 << bit)) != 0) {
        bits.add(BITS[bit]);
      }
    }
    return bits;
  }

  @Override
  public void setPermission(Path path, FsPermission permission) throws IOException {
    Files.setPosixFilePermissions(pathToFile(path).toPath(), posix(permission));
  }

  @Override
  public boolean rename(Path source, Path destination) throws IOException {
    return removeChecksum(super.rename(source, destination), destination);
  }

  @Override
  public boolean delete(Path path, boolean recursive) throws IOException {
    return removeChecksum(super.delete(path, recursive), path);
  }

  /**
   * Once `path` was renamed to or deleted (`done`), removes the checksum file Hadoop's
   * checksummed local file system keeps beside it, if any. Returns `done`.
   */
  private boolean removeChecksum(boolean done, Path path) throws IOException {
    Path parent = path.getParent();
    if (done && parent != null) {
      Path checksum = new Path(parent, "." + path.getName() + ".crc");
      Files.deleteIfExists(pathToFile(checksum).toPath());
    }
    return done;
  }
}
