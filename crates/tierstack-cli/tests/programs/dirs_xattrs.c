/* Directory streams and extended attributes as a program sees them (issue 39: the
 * interception client serves opendir/readdir and getxattr/lgetxattr itself). Run in a
 * folder given as argv[1]; prints a report that must be the same in a plain folder, through
 * FUSE and under `tierstack exec` (names and types, never inode numbers). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

static int cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void list(const char *d) {
    DIR *dp = opendir(d);
    if (!dp) {
        printf("opendir %s: %s\n", d, strerror(errno));
        return;
    }
    char *names[512];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dp)) && n < 512) {
        char buf[300];
        snprintf(buf, sizeof buf, "%s:%d", e->d_name, e->d_type);
        names[n++] = strdup(buf);
    }
    qsort(names, n, sizeof names[0], cmp);
    printf("list %s:", d);
    for (int i = 0; i < n; i++) {
        printf(" %s", names[i]);
        free(names[i]);
    }
    printf("\n");
    closedir(dp);
}

static void touch(const char *p) {
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "x", 1) != 1 || close(fd) != 0) {
        printf("touch %s: %s\n", p, strerror(errno));
    }
}

static void xget(const char *what, ssize_t r, const char *v) {
    if (r < 0)
        printf("%s: -1 %s\n", what, strerror(errno));
    else if (v)
        printf("%s: %zd %.*s\n", what, r, (int)r, v);
    else
        printf("%s: %zd\n", what, r);
}

int main(int argc, char **argv) {
    if (argc != 2 || chdir(argv[1]) != 0) {
        perror("chdir");
        return 2;
    }
    if (mkdir("d", 0755) || mkdir("d/sub", 0755) || symlink("f1", "d/l1") ||
        symlink("sub", "d/ls") || mkfifo("d/p", 0644)) {
        perror("setup");
        return 2;
    }
    char p[64];
    for (int i = 1; i <= 40; i++) {
        snprintf(p, sizeof p, "d/f%d", i);
        touch(p);
    }
    list("d");
    list("d/sub");
    list("d/ls");
    list("d/nonexist");
    list("d/f1");
    list("d/l1");

    /* telldir/seekdir come back to the same entry; rewinddir sees what was added. */
    DIR *dp = opendir("d");
    if (!dp) {
        perror("opendir d");
        return 1;
    }
    readdir(dp);
    readdir(dp);
    long t = telldir(dp);
    struct dirent *e = readdir(dp);
    char first[256];
    snprintf(first, sizeof first, "%s", e ? e->d_name : "");
    for (int i = 0; i < 5; i++)
        readdir(dp);
    seekdir(dp, t);
    e = readdir(dp);
    printf("seekdir back to the same entry: %d\n", e && strcmp(first, e->d_name) == 0);
    touch("d/added");
    rewinddir(dp);
    int n = 0, added = 0;
    while ((e = readdir(dp))) {
        n++;
        added |= strcmp(e->d_name, "added") == 0;
    }
    printf("after rewinddir: %d entries, the new one seen: %d\n", n, added);
    /* readdir_r, and the stream's descriptor for the *at calls. */
    rewinddir(dp);
    struct dirent ent, *res;
    n = 0;
    while (readdir_r(dp, &ent, &res) == 0 && res)
        n++;
    printf("readdir_r: %d entries\n", n);
    struct stat st;
    int fd = dirfd(dp);
    int r = fstatat(fd, "f1", &st, 0);
    printf("dirfd fstatat f1: %d size %lld\n", r, (long long)st.st_size);
    printf("dirfd fstat is a directory: %d\n", fstat(fd, &st) == 0 && S_ISDIR(st.st_mode));
    closedir(dp);
    list("d");

    /* Extended attributes: values, size queries, ERANGE, ENODATA, links, absent paths. */
    char v[64];
    if (setxattr("d/f1", "user.k", "hello", 5, 0))
        printf("setxattr: %s\n", strerror(errno));
    xget("getxattr user.k", getxattr("d/f1", "user.k", v, sizeof v), v);
    xget("getxattr user.k size", getxattr("d/f1", "user.k", NULL, 0), NULL);
    xget("getxattr user.k small", getxattr("d/f1", "user.k", v, 2), NULL);
    xget("getxattr user.none", getxattr("d/f1", "user.none", v, sizeof v), NULL);
    xget("lgetxattr link user.k", lgetxattr("d/l1", "user.k", v, sizeof v), NULL);
    xget("getxattr link user.k", getxattr("d/l1", "user.k", v, sizeof v), v);
    xget("getxattr absent", getxattr("d/nonexist", "user.k", v, sizeof v), NULL);
    xget("getxattr fifo user.k", getxattr("d/p", "user.k", v, sizeof v), NULL);
    xget("lgetxattr security.selinux", lgetxattr("d", "security.selinux", v, sizeof v), NULL);
    xget("getxattr acl", getxattr("d", "system.posix_acl_access", NULL, 0), NULL);
    xget("getxattr dir user.none", getxattr("d/sub", "user.none", v, sizeof v), NULL);
    return 0;
}
